"""A policy as a user writes it in their own module, for the tests that run it on every launcher."""

from dualjax.core.policies import Policy


class LongPrefixToDE(Policy):
    """Relay long prefixes through the decode host; read short ones on the prefill host."""

    name = "long-prefix-to-de"

    def path(self, request, pe, de) -> str:
        return "de" if request.hit_tokens >= 128 else "pe"
