"""The cluster's secrets, each where it is needed and nowhere else; read as data, never run.

Ray's ``file_mounts`` reach every node, so what they carry is split in two:

- **The trials' file** (``~/.detsweep/mlflow.env`` on your machine, mounted on every node):
  detsweep's user, ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, and
  nothing else (a head-only key in it is refused). Each node's raylet starts with them in its
  environment (``python -m detsweep.tracking.credentials FILE -- ray start …``) and its
  workers inherit them: they travel in no job's runtime environment, which Ray's State API
  and dashboard show to anyone who reaches the cluster.
- **The head's secret**: the admin's password, the app's session key and the database's
  URI, in AWS Secrets Manager (``secretsmanager:NAME``, read once at the server's start through
  the head's instance profile, which the worker nodes' profile is not) or a file on the head.
  Where there is none, the head makes its own admin password and session key (a try-it-out
  server whose runs die with the cluster anyway).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

TRIAL_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
HEAD_KEYS = ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY")
STORES = ("MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION")
SECRETS_MANAGER = "secretsmanager:"


def parse_env(text: str, where: str) -> dict[str, str]:
    """``KEY=VALUE`` lines as data: no shell expansion, quotes around a value dropped."""
    values = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = line.removeprefix("export ").partition("=")
        if not equals or not key.strip().isidentifier():
            raise SystemExit(f"{where}:{number}: found a line that is not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def trial_credentials(path: Path) -> dict[str, str]:
    """detsweep's user from the file every node gets; a head-only secret in it is refused."""
    values = parse_env(path.read_text(), str(path))
    if extra := [key for key in values if key not in TRIAL_KEYS]:
        raise SystemExit(f"{path}: found {', '.join(extra)}; expected only {' and '.join(TRIAL_KEYS)} in the file "
                         "every node gets (the admin's password, the session key and the stores belong in the "
                         "head's secret: README, 'A cluster closed to strangers')")
    if missing := [key for key in TRIAL_KEYS if not values.get(key)]:
        raise SystemExit(f"{path}: found no {', '.join(missing)}; expected {' and '.join(TRIAL_KEYS)}")
    return values


def head_secret(source: str) -> dict[str, str] | None:
    """The head's secret from ``secretsmanager:NAME`` or a file; None where Secrets Manager has
    no such secret (the try-it-out server)."""
    if source.startswith(SECRETS_MANAGER):
        text = _secrets_manager_value(source.removeprefix(SECRETS_MANAGER))
        if text is None:
            return None
    else:
        text = Path(source).read_text()
    values = _parse_secret(text, source)
    if missing := [key for key in HEAD_KEYS if not values.get(key)]:
        raise SystemExit(f"{source}: found no {', '.join(missing)}; expected every one of {', '.join(HEAD_KEYS)}")
    given = [key for key in STORES if values.get(key)]
    if len(given) == 1:
        raise SystemExit(f"{source}: found {given[0]} alone; expected both of {' and '.join(STORES)} "
                         "(runs and their artifacts outside the cluster) or neither (both on the head)")
    return values


def _parse_secret(text: str, where: str) -> dict[str, str]:
    """A JSON object (what Secrets Manager's console makes of key/value pairs) or ``KEY=VALUE`` lines."""
    if text.lstrip().startswith("{"):
        try:
            return {str(key): str(value) for key, value in json.loads(text).items()}
        except (ValueError, AttributeError):
            raise SystemExit(f"{where}: found text that is not a JSON object of strings; "
                             "expected one, or KEY=VALUE lines") from None
    return parse_env(text, where)


def _secrets_manager_value(name: str) -> str | None:
    import boto3
    import botocore.exceptions

    where = f"{SECRETS_MANAGER}{name}"
    try:
        value = boto3.client("secretsmanager").get_secret_value(SecretId=name)
    except botocore.exceptions.ClientError as error:
        code = error.response["Error"]["Code"]
        if code == "ResourceNotFoundException":
            return None
        expected = ("the head's instance profile to allow secretsmanager:GetSecretValue on it"
                    if code == "AccessDeniedException" else "a secret this head can read")
        raise SystemExit(f"{where}: Secrets Manager refused to give it ({code}); expected {expected}") from None
    except botocore.exceptions.BotoCoreError as error:  # no region, no credentials, no answer
        raise SystemExit(f"{where}: could not ask Secrets Manager ({error})") from None
    if "SecretString" not in value:
        raise SystemExit(f"{where}: found a binary secret; expected text (KEY=VALUE lines or a JSON object)")
    return value["SecretString"]


def generated_head_secret(folder: Path) -> dict[str, str]:
    """An admin password and session key of the head's own, kept in ``folder`` (0600) so that a
    restarted server keeps them."""
    path = folder / "head.env"
    if not path.exists():
        write_file(path, "".join(f"{key}={secrets.token_hex(16)}\n" for key in HEAD_KEYS).encode())
    return parse_env(path.read_text(), str(path))


def write_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Whole or not at all (a scratch name, then renamed), and a secret never readable by
    others for a moment: the file is made with ``mode``."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


def run_with_credentials(path: Path, command: list[str]) -> None:
    """Replace this process with ``command``, detsweep's user in its environment (a raylet's
    workers inherit it); the password is on no command line."""
    os.execvpe(command[0], command, {**os.environ, **trial_credentials(path)})


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m detsweep.tracking.credentials CREDENTIALS_FILE -- COMMAND [ARG…]")
    run_with_credentials(Path(argv[0]), argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
