"""Where dualjax keeps files of its own that outlive one command: the per-user data home.

The home is `$DUALJAX_HOME` when set, else `$XDG_DATA_HOME/dualjax`, else `~/.local/share/dualjax`
(the XDG base-directory default). It does not depend on the working directory, so a command started
anywhere finds what another wrote. It holds the `local` hardware profile: `dualjax calibrate`
writes it, `--hardware local` reads it. Read at each call, so a changed environment applies.
"""

from __future__ import annotations

import os

LOCAL_PROFILE = "local.json"


def data_home() -> str:
    """dualjax's per-user data directory (see the module doc); not made here."""
    if home := os.environ.get("DUALJAX_HOME"):
        return os.path.abspath(os.path.expanduser(home))
    xdg = os.environ.get("XDG_DATA_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "dualjax")


def local_profile() -> str:
    """The `local` hardware profile's file: what `dualjax calibrate` writes and `--hardware local` reads."""
    return os.path.join(data_home(), LOCAL_PROFILE)
