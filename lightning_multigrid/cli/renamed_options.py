"""Options of the previous release that are now spelled otherwise: the one table of old key -> new key.

The settings that travel together became one value each (``MultigridVideoDataModule``'s
``synthetic``, ``eval_views`` and ``reader_settings``; ``MultigridCallback``'s ``short_run``). A config
written for the previous release names the old flat keys; the command line's parser refuses them
("Option ... is not accepted") and :func:`renamed_hint` adds where each one went.
"""

from __future__ import annotations

import re

__all__ = ["RENAMED", "renamed_hint"]

# old key (as the previous release's config wrote it in its section) -> the new key, with its section
RENAMED: dict[str, str] = {
    "synthetic_dir": "data.synthetic.path",
    "synthetic_size": "data.synthetic.size",
    "synthetic_texture_cell": "data.synthetic.texture_cell",
    "synthetic_format": "data.synthetic.format",
    "num_views": "data.eval_views.num_views",
    "num_crops": "data.eval_views.num_crops",
    "metadata_file": "data.reader_settings.metadata_file",
    "frame_decode": "data.reader_settings.frame_decode",
    "filename_tmpl": "data.reader_settings.filename_tmpl",
    "allow_frame_gaps": "data.reader_settings.allow_frame_gaps",
    "short_run_coarse_share": "multigrid.short_run.coarse_share",
    "short_run_max_lr_factor": "multigrid.short_run.max_lr_factor",
}


def renamed_hint(message: str) -> str:
    """What to add to a parser's error ``message``: the new key of each old key it names, or ``""``.

    An old key counts when the message refuses it (``Option 'frame_decode' is not accepted``,
    ``Group 'multigrid' does not accept option 'short_run_coarse_share'``, ``unrecognized arguments:
    --multigrid.short_run_coarse_share``) or
    shows it among the values given (``{'frame_decode': ...}``): the parser stops at the first
    unknown key, and the hint names every one the config still has.
    """
    named = re.findall(r"Option '([\w.]+)' is not accepted|does not accept option '([\w.]+)'", message)
    named = [first or second for first, second in named]
    for line in re.findall(r"unrecognized arguments: (.*)", message):
        named += re.findall(r"--([\w.]+)", line)
    refused = {key.rpartition(".")[2] for key in named}
    given = set(re.findall(r"'(\w+)':", message))
    old = [key for key in RENAMED if key in refused or (refused and key in given)]
    if not old:
        return ""
    lines = [f"  `{key}` is now `{RENAMED[key]}`" for key in old]
    return "\nOptions of the previous release, renamed (change them in the config or flags):\n" + "\n".join(lines)
