"""Where to connect: arguments, else MPTRAIN_* environment variables, else the config file's
context, as trainctl decides (client/client_config.h has the file's format).

The file is hostile input: read only if it is a regular file of at most 64 KiB that no one but
its owner may read or write, every line one of `current-context = NAME`, `[context NAME]`,
`KEY = VALUE`; an error names the file and the line, never what the line holds.
"""
import os
import re
import stat

MAX_CONFIG_BYTES = 64 * 1024
MAX_CONTEXTS = 64
MAX_VALUE_BYTES = 4096
KEYS = ("coordinator", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "token_file")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,63}\Z")
DEFAULT_COORDINATOR = "127.0.0.1:50051"


class ConfigError(ValueError):
    """A config file, token file or setting that cannot be used."""


def config_path():
    """$MPTRAIN_CONFIG, else ~/.config/mptrain/config; None if neither can be named."""
    explicit = os.environ.get("MPTRAIN_CONFIG")
    if explicit:
        return explicit
    home = os.environ.get("HOME")
    return os.path.join(home, ".config", "mptrain", "config") if home else None


def _printable(value):
    return len(value) <= MAX_VALUE_BYTES and all(0x20 <= ord(c) < 0x7F for c in value)


def load_config(path):
    """{"current_context": str or None, "contexts": {name: {key: value}}}; a missing file is
    empty. Raises ConfigError naming the file (and the line)."""
    config = {"current_context": None, "contexts": {}}
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return config
    except OSError as error:
        raise ConfigError(f"config file {path}: cannot be read: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"config file {path}: not a regular file")
    if info.st_mode & 0o077:
        raise ConfigError(f"config file {path}: others may read or write it (chmod 600 {path})")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: more than the {MAX_CONFIG_BYTES} bytes it may hold")
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    context, current_line = None, 0
    for number, raw in enumerate(data.split(b"\n"), start=1):
        def bad(why):
            return ConfigError(f"config file {path} line {number}: {why}")
        try:
            line = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise bad("a value holds a control or non-ASCII character") from None
        if len(line) > MAX_VALUE_BYTES + 64:
            raise bad("longer than a line may be")
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            if not (line.startswith("[context ") and line.endswith("]")):
                raise bad("not a section (one `[context NAME]`)")
            name = line[len("[context "):-1]
            if not _NAME.match(name):
                raise bad("a context name is 1 to 63 of letters, digits, '.', '_' and '-'")
            if name in config["contexts"]:
                raise bad("a second context of the same name")
            if len(config["contexts"]) >= MAX_CONTEXTS:
                raise bad(f"more than {MAX_CONTEXTS} contexts")
            context = config["contexts"][name] = {}
            continue
        if "=" not in line:
            raise bad("not `key = value`")
        key, value = (part.strip() for part in line.split("=", 1))
        if not _printable(value):
            raise bad("a value holds a control or non-ASCII character")
        if context is None:
            if key != "current-context":
                raise bad("before the first [context NAME], only `current-context = NAME`")
            if not _NAME.match(value):
                raise bad("a context name is 1 to 63 of letters, digits, '.', '_' and '-'")
            config["current_context"], current_line = value, number
            continue
        if key not in KEYS:
            raise bad("unknown key (" + ", ".join(KEYS) + ")")
        context[key] = value
    if config["current_context"] and config["current_context"] not in config["contexts"]:
        raise ConfigError(f"config file {path} line {current_line}: "
                          "current-context names no context")
    return config


def resolve(context=None, **given):
    """The settings to connect with: each of KEYS from `given` (not None), else MPTRAIN_<KEY>,
    else the context (`context`, else $MPTRAIN_CONTEXT, else the file's current one)."""
    from_context = {}
    path = config_path()
    wanted = context or os.environ.get("MPTRAIN_CONTEXT")
    if path:
        config = load_config(path)
        name = wanted or config["current_context"]
        if name:
            if name not in config["contexts"]:
                raise ConfigError(f"{path} has no context named {name}")
            from_context = config["contexts"][name]
    elif wanted:
        raise ConfigError("a context needs a config file (set MPTRAIN_CONFIG or HOME)")
    settings = {}
    for key in KEYS:
        value = given.get(key)
        if value is None:
            value = os.environ.get("MPTRAIN_" + key.upper()) or None
        if value is None and not (key == "token_file" and os.environ.get("MPTRAIN_TOKEN")):
            value = from_context.get(key)
        settings[key] = value
    settings["coordinator"] = settings["coordinator"] or DEFAULT_COORDINATOR
    return settings


def _read_small(what, path, limit):
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{what} {path}: not a regular file")
            data = f.read(limit + 1)
    except OSError as error:
        raise ConfigError(f"{what} {path}: cannot be read: {error.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path}: more than the {limit} bytes it may hold")
    return data


def load_token(token_file):
    """The token (its file's first non-empty line, else $MPTRAIN_TOKEN), or None."""
    source = "MPTRAIN_TOKEN"
    if token_file:
        text, source = _read_small("--token_file", token_file, 4096), "--token_file"
    else:
        text = os.environ.get("MPTRAIN_TOKEN", "").encode()
    for line in text.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        if not all(0x21 <= b < 0x7F for b in line):
            raise ConfigError(f"{source}: the token must be one word of printable characters")
        return line.decode()
    if token_file:
        raise ConfigError(f"--token_file {token_file}: empty")
    return None


def read_pem(what, path):
    return _read_small(what, path, 1 << 20)
