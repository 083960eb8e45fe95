"""The environment file the systemd units read (`EnvironmentFile=`, deploy/dropbox-eval.env),
read by the command line too (`--env-file`, `SAAS_EVAL_ENV_FILE`), so that every command
runs with the service's settings.

systemd's syntax: `KEY=value`, one a line, `#` comments, values optionally quoted, no
`export` and no `$VAR` expansion (python-dotenv reads it so, with interpolation off).
"""

from __future__ import annotations

from pathlib import Path

from dotenv import dotenv_values

ENV_FILE_VARIABLE = "SAAS_EVAL_ENV_FILE"


def read_env_file(path: Path, prefix: str) -> dict[str, str]:
    """`{name: value}` for each `<prefix>NAME=value` line of the file at `path` (name in
    lower case, as the settings spell it); OSError when it cannot be read."""
    with path.open(encoding="utf-8") as handle:  # a missing file is an error, not nothing
        values = dotenv_values(stream=handle, interpolate=False)
    return {
        key[len(prefix) :].lower(): value
        for key, value in values.items()
        if key.startswith(prefix) and value is not None
    }
