"""A user's policy as a sweep gets it (test_sweep): an importable class, so worker processes load it."""

from dualjax.core.policies import Policy


class AlwaysDe(Policy):
    """Every read on the decode side: the `de-only` rule, written by a user."""

    name = "always-de"

    def path(self, request, pe, de):
        return "de"
