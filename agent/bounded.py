"""Bounded input: zip members are capped from their header sizes before anything is inflated.

Every file format this project reads that is a zip goes through here: the PPO experts'
stable-baselines3 zips (:mod:`agent.experts.policy`, :mod:`agent.eval.card`) and the
``torch.save`` zips of ``.pt`` policy files and of an expert's ``policy.pth``
(:func:`agent.nn.policy.read_policy_file`). A zip's headers say how large each member inflates
(``ZipInfo.file_size``), so a reader can refuse a member before reading a byte of it; a zip bomb
inflates a few MB into GBs (issue 38, "Nothing lost", item 4: a 4.8 MB expert zip whose ``data``
member inflated to 3 GiB cost 38 s and 6.6 GB of memory before this check existed).

Two guards, since a crafted header may lie:

- :func:`read_zip_member` checks the member count and the declared size, then reads at most
  ``limit + 1`` bytes and refuses the member if more come out;
- :func:`check_zip_sizes` checks the declared sizes of every member of a zip that another library
  then reads (``torch.load``): PyTorch's reader (miniz) allocates each record from its declared
  size and fails if the inflated bytes disagree, so the declared sizes bound its memory.

The limits themselves live with each format's reader (:data:`agent.experts.policy.MAX_JSON_BYTES`,
:data:`agent.nn.policy.MAX_POLICY_FILE_BYTES`, ...), where the sizes of the files are known.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

#: the most members an expert zip may hold (stable-baselines3 writes 6, the model card makes 7)
MAX_ZIP_MEMBERS = 64


class ZipMemberTooLarge(ValueError):
    """A zip member above the size limit its reader allows, or a zip with too many members.

    The message names the file, the member, its declared size and the limit.
    """


def read_zip_member(zf: zipfile.ZipFile, name: str, path: str | Path, limit: int,
                    max_members: int = MAX_ZIP_MEMBERS) -> bytes:
    """The bytes of zip member ``name``, never more than ``limit`` bytes inflated.

    The member count and the header's declared size (``ZipInfo.file_size``) are checked before
    anything is inflated; since a crafted header can understate the size, the member is then read
    with a bounded read (``limit + 1`` bytes at most) and refused if more comes out. Memory stays
    at about ``limit`` bytes whatever the file holds.

    Args:
        zf: an open ``zipfile.ZipFile``.
        name: the member.
        path: the zip's path, for messages.
        limit: the most bytes the member may inflate to.
        max_members: the most members the zip may hold.

    Raises:
        KeyError: no member ``name`` (as ``ZipFile.getinfo``).
        ZipMemberTooLarge: more than ``max_members`` members, a declared size above ``limit``, or
            more than ``limit`` bytes coming out of a member whose header declared less.
        zipfile.BadZipFile, OSError, RuntimeError: as ``ZipFile.open`` (corrupt data, encrypted entries).
    """
    _check_count(zf, path, max_members)
    info = zf.getinfo(name)
    if info.file_size > limit:
        raise ZipMemberTooLarge(f"{path}: zip member {name!r} would inflate to {info.file_size:,} bytes as its header "
                                f"declares (limit {limit:,} bytes); refused before reading it: not a file this "
                                "project wrote")
    with zf.open(info) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ZipMemberTooLarge(f"{path}: zip member {name!r} inflates to more than {limit:,} bytes (the limit) "
                                f"although its header declares {info.file_size:,}; refused: a corrupt or crafted file")
    return data


def check_zip_sizes(source: str | Path | bytes, path: str | Path, max_total: int, max_members: int) -> bool:
    """Check a zip's member count and declared inflated sizes before another library reads it.

    Args:
        source: the zip, as a path or as its bytes.
        path: the file to name in messages (for bytes: the file they came from and the member).
        max_total: the most bytes all members together may declare.
        max_members: the most members.

    Returns:
        True for a zip within the limits; False when ``source`` is not a zip at all (the caller
        decides whether that format is acceptable).

    Raises:
        ZipMemberTooLarge: more members than ``max_members``, or declared sizes summing above
            ``max_total`` (the message names the largest member).
        OSError: the file cannot be read.
    """
    try:
        zf = zipfile.ZipFile(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source)
    except zipfile.BadZipFile:
        return False
    with zf:
        _check_count(zf, path, max_members)
        infos = zf.infolist()
        total = sum(i.file_size for i in infos)
        if total > max_total:
            big = max(infos, key=lambda i: i.file_size)
            raise ZipMemberTooLarge(f"{path}: its zip members declare {total:,} bytes inflated in all (limit "
                                    f"{max_total:,} bytes; the largest, {big.filename!r}, declares "
                                    f"{big.file_size:,}); refused before reading it: not a file this project wrote")
    return True


def _check_count(zf: zipfile.ZipFile, path, max_members: int) -> None:
    count = len(zf.infolist())
    if count > max_members:
        raise ZipMemberTooLarge(f"{path} holds {count:,} zip members (limit {max_members:,}); refused before "
                                "reading any: not a file this project wrote")


__all__ = ["MAX_ZIP_MEMBERS", "ZipMemberTooLarge", "check_zip_sizes", "read_zip_member"]
