"""A store's own metadata: opened, checked, and recovered when damaged. TensorStore does all of it,
whichever back end then moves the blocks.

Two keys describe a store, and both follow from the layout:

* `dualjax_store.json`, the manifest: format, version, the layout and its fingerprint, and the
  blocks per segment S. A store of another version or fingerprint is refused, naming both: that is
  not damage;
* `data/zarr.json`: the zarr3 metadata of the data array, which TensorStore writes from the
  manifest's layout and S.

A store is a cache, so damage to either never stops a run (`open_metadata`):

* a manifest cut short, garbled, or missing while `index/` and `data/` remain is rebuilt from this
  layout when the store's index entries are this layout's (their hashes come back from parent and
  tokens under its fingerprint) or there are none; otherwise the store's `index/`, `data/` and
  manifest are set aside in `damaged/<id>/` and a fresh store starts beside them;
* a `data/zarr.json` missing (while segments exist), not JSON, or not this array's is rewritten.

Each recovery is one WARNING line saying what was found and done, and one key `recovered/<id>`
that the store reports once, as its `recovered` counter, in whichever process asks first
(`BlockStore.stats`). A repair is a conditional write: of several processes opening a damaged
store at once, one repairs it and says so (atomic where the kvstore makes conditional writes
atomic; TensorStore's `file` driver without locking does not quite).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import NamedTuple

import tensorstore as ts

from kvstore.backend import log, prefix_range, sub_spec
from kvstore.errors import FingerprintMismatch, StoreError
from kvstore.hashing import is_hash
from kvstore.layout import BlockLayout
from kvstore.segments import (
    COUNTER_BITS,
    MAX_SEGMENT_SLOTS,
    decode_entry,
    entry_bytes,
    segment_slots,
    zarr_metadata,
)

MANIFEST = "dualjax_store.json"
ARRAY = "data/zarr.json"
RECOVERED = "recovered/"  # one key per recovery not yet reported
DAMAGED = "damaged/"  # what a recovery set aside
FORMAT_VERSION = 4
STORE_PREFIXES = ("index/", "data/", RECOVERED, DAMAGED)
SAMPLED_ENTRIES = 8  # index entries a lost manifest's store is judged by


class Opened(NamedTuple):
    """A store's metadata once open: its blocks per segment S and its data array."""

    slots_per_segment: int
    array: ts.TensorStore


def store_name(kv: ts.KvStore) -> str:
    """The store in messages: its directory, or its kvstore URL."""
    spec = kv.spec().to_json()
    if spec.get("driver") == "file":
        return spec["path"]
    try:
        return kv.url
    except ValueError:
        return spec.get("driver", "kvstore") + ":" + spec.get("path", "")


def manifest_for(layout: BlockLayout, slots: int) -> dict:
    return {"format": "dualjax-kvstore", "version": FORMAT_VERSION, "fingerprint": layout.fingerprint(),
            "layout": layout.to_json(), "segment_slots": slots}


def open_metadata(kv: ts.KvStore, layout: BlockLayout, context: ts.Context) -> Opened:
    """Create, check or recover the manifest, then the data array's metadata. Raises StoreError
    (FingerprintMismatch) for a store that is not this layout's, or not a dualjax store at all;
    ValueError (TensorStore's) when the kvstore cannot be read or written."""
    recovered: list[str] = []
    slots = _open_manifest(kv, layout, recovered)
    array = _open_array(kv, layout, slots, context, recovered)
    if recovered:
        key = RECOVERED + _event_id()
        kv.write(key, "; ".join(recovered)).result()
        log.warning("KV store %s recovered: %s (counted as `recovered`)", store_name(kv), "; ".join(recovered))
    return Opened(slots, array)


def _event_id() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y%m%dT%H%M%S}-{os.getpid()}-{os.urandom(2).hex()}"


def _parse(raw: bytes) -> tuple[dict | None, str]:
    """A manifest, or None and what is wrong with it."""
    try:
        m = json.loads(raw)
    except ValueError:
        return None, f"is not JSON ({len(raw)} bytes, cut short or garbled)"
    if not isinstance(m, dict) or m.get("format") != "dualjax-kvstore" or not isinstance(m.get("version"), int) \
            or not isinstance(m.get("fingerprint"), str):
        return None, "is not a dualjax store manifest"
    slots = m.get("segment_slots")
    if m["version"] == FORMAT_VERSION and (not isinstance(slots, int) or slots < 1 or slots & (slots - 1)
                                           or slots > 1 << COUNTER_BITS):
        return None, f"has segment_slots {slots!r}, not a power of two up to 2**{COUNTER_BITS}"
    return m, ""


def _open_manifest(kv: ts.KvStore, layout: BlockLayout, recovered: list[str], retry: bool = True) -> int:
    """S of the store, its manifest checked; created in an empty store, recovered when damaged."""
    got = kv.read(MANIFEST).result()
    if got.state == "value":
        manifest, why = _parse(got.value)
        if manifest is not None:
            return _check(manifest, layout)
    else:
        keys = [k.decode() for k in kv.list().result()]
        foreign = [k for k in keys if not k.startswith(STORE_PREFIXES) and k != MANIFEST]  # made since: retried
        if foreign:
            raise StoreError(f"{store_name(kv)} is not a dualjax store (no {MANIFEST}, but it holds {len(keys)} keys, "
                             f"e.g. {foreign[0]!r}); give an empty location or a dualjax store")
        why = "is missing" if keys else ""
    theirs = _blocks_match(kv, layout) if why else None  # False: the blocks are another layout's
    slots = (_array_slots(kv) if theirs is not False and why else None) or segment_slots(layout)
    fresh = json.dumps(manifest_for(layout, slots), indent=1)
    if not kv.write(MANIFEST, fresh, if_equal=got.stamp.generation).result().generation:
        if retry:  # another process wrote it first: check theirs
            return _open_manifest(kv, layout, recovered, retry=False)
        raise StoreError(f"{store_name(kv)}: {MANIFEST} keeps changing under this process; is another one "
                         "rewriting it?")
    if theirs is False:
        where = DAMAGED + _event_id() + "/"
        _set_aside(kv, where, got.value if got.state == "value" else None)
        recovered.append(f"{MANIFEST} {why} and the blocks are another layout's: set them aside in {where}, "
                         "a fresh store beside them")
    elif why:
        recovered.append(f"{MANIFEST} {why}: rebuilt from this layout")
    return slots


def _check(manifest: dict, layout: BlockLayout) -> int:
    """S of a sound manifest of this version and fingerprint, else StoreError."""
    version, theirs = manifest["version"], manifest["fingerprint"]
    if version != FORMAT_VERSION:
        raise StoreError(f"store format version {version} is not this dualjax's version {FORMAT_VERSION}; use a new "
                         "store directory or delete the old store", "version")
    if theirs != layout.fingerprint():
        raise FingerprintMismatch(
            f"store fingerprint {theirs} (format {_describe(manifest.get('layout'))}) does not match this run's "
            f"{layout.fingerprint()} (format {layout.describe()}); use another store directory, or the store's "
            "model, weights and layout")
    return manifest["segment_slots"]


def _describe(layout_json) -> str:
    try:
        return BlockLayout.from_json(layout_json).describe()
    except (TypeError, ValueError, KeyError):
        return f"unreadable layout {layout_json!r}"


def _array_slots(kv: ts.KvStore) -> int | None:
    """S as the data array's metadata has it (its chunks' first extent), if it is readable."""
    got = kv.read(ARRAY).result()
    try:
        slots = json.loads(got.value)["chunk_grid"]["configuration"]["chunk_shape"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return slots if isinstance(slots, int) and 0 < slots <= MAX_SEGMENT_SLOTS and not slots & (slots - 1) else None


def _blocks_match(kv: ts.KvStore, layout: BlockLayout) -> bool | None:
    """Whether the store's blocks are this layout's: True when one of the first few index entries
    decodes and hashes back under its fingerprint, False when none does, None when there are none."""
    keys = [k.decode() for k in kv.list(prefix_range("index/")).result()]
    hashes = [k[len("index/"):] for k in keys if is_hash(k[len("index/"):])][:SAMPLED_ENTRIES]
    if not hashes:
        return None
    limit = entry_bytes(layout, MAX_SEGMENT_SLOTS)
    for h in hashes:
        try:  # the entry is at the value's end: a hard link to a whole segment file needs only that
            raw = kv.read("index/" + h, byte_range=slice(-limit, None)).result().value
        except ValueError:  # shorter than `limit`: an entry alone
            raw = kv.read("index/" + h).result().value
        if decode_entry(raw, h, layout) is not None:
            return True
    return False


def _set_aside(kv: ts.KvStore, where: str, manifest: bytes | None) -> None:
    """Move `index/` and `data/` under `where` (renames on a local directory, copies and deletes
    elsewhere), with the damaged manifest's bytes."""
    if manifest is not None:
        kv.write(where + MANIFEST, manifest).result()
    spec = kv.spec().to_json()
    if spec.get("driver") == "file":
        os.makedirs(os.path.join(spec["path"], where), exist_ok=True)
        for name in ("index", "data"):
            if os.path.exists(os.path.join(spec["path"], name)):
                os.rename(os.path.join(spec["path"], name), os.path.join(spec["path"], where, name))
        return
    for prefix in ("index/", "data/"):
        for key in kv.list(prefix_range(prefix)).result():
            kv.write(where + key.decode(), kv.read(key).result().value).result()
            kv.write(key, None).result()


def _open_array(kv: ts.KvStore, layout: BlockLayout, slots: int, context: ts.Context,
                recovered: list[str]) -> ts.TensorStore:
    """The data array, its metadata rewritten from the manifest when it is missing (while segments
    exist), not JSON, or not this array's."""
    spec = {"driver": "zarr3", "kvstore": sub_spec(kv.spec().to_json(), "data/"),
            "fill_missing_data_reads": False, "metadata": zarr_metadata(layout, slots)}
    got = kv.read(ARRAY).result()
    if got.state == "value":
        try:
            return ts.open(spec, open=True, context=context).result()
        except ValueError:
            try:
                json.loads(got.value)
                why = "does not describe this store's array"
            except ValueError:
                why = f"is not JSON ({len(got.value)} bytes, cut short or garbled)"
    elif kv.list(prefix_range("data/")).result():
        why = "is missing"
    else:
        return ts.open(spec, create=True, open=True, context=context).result()  # a new store
    if kv.write(ARRAY, _canonical(spec), if_equal=got.stamp.generation).result().generation:
        recovered.append(f"{ARRAY} {why}: rebuilt from the manifest")
    return ts.open(spec, open=True, context=context).result()


def _canonical(spec: dict) -> bytes:
    """The bytes TensorStore writes as `zarr.json` for the array of `spec`."""
    array = ts.open(dict(spec, kvstore="memory://"), create=True, context=ts.Context()).result()
    return array.kvstore.read("zarr.json").result().value
