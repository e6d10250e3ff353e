"""A policy as a user writes it in their own module, for the tests that run it on every launcher."""

from dualjax.core.policies import Plan, Policy


class LongPrefixToDE(Policy):
    """Relay long prefixes through the decode host; read short ones on the prefill host."""

    name = "long-prefix-to-de"

    def path(self, request, pe, de) -> str:
        return "de" if request.hit_tokens >= 128 else "pe"


# A policy author's mistakes, each reported in one line naming the policy, the request and the fault
# (tests/dualjax/core/test_policy_author.py).

class Raises(Policy):
    """A bug in `path`: a missing key."""

    name = "raises"

    def path(self, request, pe, de) -> str:
        return {"pe": "pe"}[request.agent]


class NotAPath(Policy):
    """Answers a side that does not exist."""

    name = "not-a-path"

    def path(self, request, pe, de) -> str:
        return "both"


class HalfBlock(Policy):
    """Splits a long prefix mid-block."""

    name = "half-block"

    def path(self, request, pe, de):
        return Plan(de_tokens=request.block_tokens // 2) if request.hit_tokens else "pe"


class NeedsMargin(Policy):
    """A constructor argument without a default."""

    name = "needs-margin"

    def __init__(self, margin_tokens):
        self.margin = margin_tokens

    def path(self, request, pe, de) -> str:
        return "pe"
