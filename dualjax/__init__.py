"""dualjax runtime: DualPath over a prefill mesh and a decode mesh (see README and DESIGN.md)."""

from dualjax.layout import layout_for

__all__ = ["layout_for"]
