"""Settings as they may be shown outside this machine (a model card on the Hub, a tracker's server): the values of
secrets masked. A plugin reward's ``args`` (``api_key: ...``), ``logging.tracker_kwargs`` (comet's ``api_key``) or a
URL with a user and password (``https://user:pw@host``) would otherwise be copied there. Files on this machine
(config.json, checkpoints) keep the settings as given: a resume compares them.
"""

from __future__ import annotations

import re

MASK = "***"
# a key that holds a secret by its name: token, hf_token, api_key, apikey, secret, password, auth, credentials...;
# not the data section's column names (prompt_key) nor a secret's file (token_file)
SECRET_KEY = re.compile(
    r"(^|_)(api_?key|access_?key|private_?key|secret(_?key)?|password|passwd|token|auth|credentials?)$|^key$",
    re.IGNORECASE,
)
URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@", re.IGNORECASE)


def redacted(value, key: str = ""):
    """``value`` (a config dict, list or scalar; ``key`` its name) with secrets masked: the value of a key named like
    a secret, and a URL's ``user:password@``. Other values are returned as they are."""
    if isinstance(value, dict):
        return {k: redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redacted(v) for v in value)
    if key and SECRET_KEY.search(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return URL_USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", value)
    return value
