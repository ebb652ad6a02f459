"""Reading a ``torch.save`` file that may have been crafted: bounded plain data, or a one-line ConfigError.

``torch.load(weights_only=True)`` runs no code from the file, but what it is allowed to build can still cost more
than the file: a deflated zip record expands to any size, its allow-listed callables (``bytearray``,
``torch.Tensor``, the legacy ``torch.FloatTensor``) allocate what an integer in the file asks for, and a stride-0
tensor claims 10^12 elements of a 4-byte storage, which the first copy of it allocates. So a file is checked in three
steps, each before anything the next one allocates:

1. the zip archive: every record stored uncompressed and inside the file, so no record is larger than the file;
2. the pickle, run opcode by opcode on stand-ins (no object is built): only the opcodes ``torch.save`` writes for
   plain data, only ``GLOBALS`` named, and only ``CALLS`` called, each with the arguments ``torch.save`` gives it
   (a tensor is rebuilt from a storage of the file, never constructed from a size);
3. the loaded data: dicts (string or integer keys), lists, tuples, None, bools, ints, floats, strings, and dense
   strided CPU tensors of those dtypes that claim no more bytes than their storage holds; at most ``MAX_DEPTH``
   levels deep, at most as many values as the pickle has bytes (each value is an opcode of it, unless the pickle's
   memo shares it, and a shared one would be walked, and hashed, once per reference), and at most as many tensor
   bytes as the file has.

What a read costs is bounded by bytes read: the pickle is read whole (the values walked: at most its length), and
every tensor byte is a byte of the file (at most its size, ``st_size``). A sparse file's holes are bytes that read as
zeros: they count in full, so a file costs at most what its size says, whatever it takes on disk.

Machina's own files pass all three: they are dicts of plain values and of tensors that own their storage.
"""

import os
import pickletools
import zipfile
from pathlib import Path
from typing import Any

import torch

from machina.errors import ConfigError

# The dtypes of machina's files, and the storage class ``torch.save`` names for each.
STORAGES = {
    torch.float16: "HalfStorage",
    torch.bfloat16: "BFloat16Storage",
    torch.float32: "FloatStorage",
    torch.float64: "DoubleStorage",
    torch.uint8: "ByteStorage",
    torch.int8: "CharStorage",
    torch.int16: "ShortStorage",
    torch.int32: "IntStorage",
    torch.int64: "LongStorage",
    torch.bool: "BoolStorage",
}
STORAGE_NAMES = {f"torch {name}" for name in STORAGES.values()}


class Named(str):
    """Stand-in of what a GLOBAL opcode names."""


STORAGE, DATA, MARK = object(), object(), object()  # stand-ins: a storage of the file, any other value, a mark
# What a pickle of plain data may call, each with a test of its (stand-in) arguments: a tensor rebuilt from a storage
# of the file; the same for a tensor that carries Python attributes (torch marks an optimizer's state tensors for its
# compiler), rebuilt as a plain torch.Tensor; an empty OrderedDict (a state_dict, filled by SETITEMS).
CALLS = {
    "torch._utils _rebuild_tensor_v2": lambda args: _starts(args, (STORAGE,)),
    "torch._tensor _rebuild_from_type_v2": lambda args: _starts(
        args, ("torch._utils _rebuild_tensor_v2", "torch Tensor", (STORAGE,))
    ),
    "collections OrderedDict": lambda args: args == (),
}
GLOBALS = {*CALLS, "torch Tensor", *STORAGE_NAMES}
PUSHES_DATA = {"EMPTY_DICT", "EMPTY_LIST", "BINUNICODE", "NEWTRUE", "NEWFALSE", "NONE", "BINFLOAT", "LONG1"}
PUSHES_DATA |= {"BININT", "BININT1", "BININT2"}
FILLS = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}  # opcodes that put what they pop into the object under it
LEAVES = (type(None), bool, int, float, str)
MAX_DEPTH = 32  # machina's files nest about 10 levels (a loss's packed recurrent state, in a rank of a checkpoint)


def load(path: Path) -> Any:
    """The data of the ``torch.save`` file ``path``, checked as the module docstring says."""
    path = Path(path)
    where = f"checkpoint {str(path)!r}"
    if not path.is_file():
        raise ConfigError(f"{where} {'is not a regular file' if os.path.lexists(path) else 'does not exist'}")
    size = path.stat().st_size
    pickled = _pickle_bytes(path, size, where)
    _check_pickle(pickled, where)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling errors come in many types; all mean "not loadable"
        raise ConfigError(
            f"{where} cannot be loaded safely ({type(err).__name__}: {' '.join(str(err).split())[:200]}); it is "
            "truncated, not a machina checkpoint, or carries pickled objects, which are refused"
        ) from None
    _check_plain(data, len(pickled), size, where)
    return data


def _pickle_bytes(path: Path, size: int, where: str) -> bytes:
    """The archive's ``data.pkl``, read once every record is known to be stored uncompressed inside the file."""
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            pickles = [record for record in records if record.filename.endswith("/data.pkl")]
            if len(pickles) == 1 and _records_fit(records, size, where):
                return archive.read(pickles[0])
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise ConfigError(
            f"{where} cannot be loaded safely (not a torch.save zip archive: {' '.join(str(err).split())[:200]}); "
            "it is truncated or not a machina checkpoint"
        ) from None
    raise ConfigError(f"{where} cannot be loaded safely: it has {len(pickles)} data.pkl records, not one")


def _records_fit(records: list[zipfile.ZipInfo], size: int, where: str) -> bool:
    """Refuse a compressed record (a small one can expand to any size) or records that claim more than the file."""
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED:
            raise ConfigError(f"{where} cannot be loaded safely: its record {record.filename!r} is compressed")
        if record.header_offset + record.file_size > size:
            raise ConfigError(f"{where} cannot be loaded safely: its record {record.filename!r} lies past its end")
    if sum(record.file_size for record in records) > size:
        raise ConfigError(f"{where} cannot be loaded safely: its records claim more bytes than the file has")
    return True


def _check_pickle(pickled: bytes, where: str) -> None:
    """Run the pickle's opcodes on stand-ins (nothing is built or called) and refuse it unless it builds plain data
    only (the module docstring's step 2)."""

    def refuse(what: str) -> None:
        raise ConfigError(
            f"{where} cannot be loaded safely: it carries pickled objects, which are refused ({what}; machina's files "
            "hold only plain data and tensors of ordinary dtypes)"
        )

    stack: list[Any] = []
    memo: dict[int, Any] = {}
    try:
        for opcode, argument, _ in pickletools.genops(pickled):
            name = opcode.name
            if name in PUSHES_DATA:
                stack.append(DATA)
            elif name == "MARK":
                stack.append(MARK)
            elif name in ("BINPUT", "LONG_BINPUT"):
                memo[argument] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                stack.append(memo[argument])
            elif name == "GLOBAL":
                if argument not in GLOBALS:
                    refuse(f"its pickle names {argument!r}")
                stack.append(Named(argument))
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(name[-1])
                items = tuple(stack[-count:])
                del stack[-count:]
                stack.append(items)
            elif name == "TUPLE":
                stack.append(tuple(_pop_to_mark(stack)))
            elif name in FILLS or name in ("APPENDS", "SETITEMS"):
                if name in FILLS:
                    del stack[-FILLS[name] :]
                else:
                    _pop_to_mark(stack)
                if stack[-1] is not DATA:
                    refuse(f"{name} into {stack[-1]!r}")
            elif name == "BINPERSID":
                saved_id = stack.pop()
                if not (isinstance(saved_id, tuple) and len(saved_id) == 5 and saved_id[1] in STORAGE_NAMES):
                    refuse("a persistent id that is not a storage of the file")
                stack.append(STORAGE)
            elif name == "REDUCE":
                arguments, function = stack.pop(), stack.pop()
                if not (isinstance(function, Named) and function in CALLS):
                    refuse(f"it calls {function if isinstance(function, Named) else 'a value'!r}")
                if not CALLS[function](arguments):
                    refuse(f"it calls {function!r} with arguments torch.save never gives it")
                stack.append(DATA)
            elif name not in ("PROTO", "STOP"):
                refuse(f"its pickle uses the opcode {name}")
    except ConfigError:
        raise
    except (ValueError, IndexError, KeyError, StopIteration) as err:  # an unknown opcode, a cut argument, a bad memo
        raise ConfigError(
            f"{where} cannot be loaded safely: its pickle is damaged ({type(err).__name__}: {err})"
        ) from None


def _pop_to_mark(stack: list[Any]) -> list[Any]:
    """Pop the items above the topmost mark, and the mark."""
    index = len(stack) - 1 - next(i for i, item in enumerate(reversed(stack)) if item is MARK)
    items = stack[index + 1 :]
    del stack[index:]
    return items


def _starts(arguments: Any, pattern: tuple) -> bool:
    """Whether the stand-in tuple ``arguments`` starts with ``pattern`` (a nested tuple matches item by item)."""
    if not isinstance(arguments, tuple) or len(arguments) < len(pattern):
        return False
    return all(
        _starts(item, expected) if isinstance(expected, tuple) else item == expected
        for item, expected in zip(arguments, pattern, strict=False)
    )


def _check_plain(data: Any, pickle_size: int, size: int, where: str) -> None:
    """Walk ``data`` (with its own stack: no recursion) and refuse the first value the module docstring does not
    allow, naming its entry: more values than ``pickle_size`` (the pickle's bytes) or more tensor bytes than ``size``
    (the file's) included."""
    pending: list[tuple[Any, str, int]] = [(data, "", 0)]
    values = tensor_bytes = 0
    while pending:
        value, name, depth = pending.pop()
        entry = name or "its data"
        values += 1
        if values > pickle_size:
            raise ConfigError(f"{where}: its data holds more values than its pickle has bytes (at {entry})")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: {entry} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, torch.Tensor):
            tensor_bytes += _tensor_bytes(value, entry, where)
            if tensor_bytes > size:
                raise ConfigError(f"{where}: its tensors claim more bytes than the file has (at {entry})")
        elif isinstance(value, dict):
            for key, item in value.items():
                if type(key) not in (str, int):
                    raise ConfigError(f"{where}: {entry} has a key of type {type(key).__name__}, not str or int")
                pending.append((item, f"{name}.{key}" if name else str(key), depth + 1))
        elif isinstance(value, list | tuple):
            pending += [(item, f"{name}[{i}]", depth + 1) for i, item in enumerate(value)]
        elif type(value) not in LEAVES:
            raise ConfigError(f"{where}: {entry} is a {type(value).__name__}, which machina's files never hold")


def _tensor_bytes(tensor: torch.Tensor, entry: str, where: str) -> int:
    """The bytes a copy of ``tensor`` takes; refuse any tensor but a dense strided CPU one of a ``STORAGES`` dtype
    whose elements fit in its storage (a stride-0 view claims more)."""
    if type(tensor) is not torch.Tensor or tensor.layout != torch.strided or tensor.device.type != "cpu":
        kind = f"{type(tensor).__name__} ({tensor.layout}, on {tensor.device.type})"
        raise ConfigError(f"{where}: {entry} is a {kind}, not a dense CPU tensor")
    if tensor.dtype not in STORAGES:
        raise ConfigError(f"{where}: {entry} has dtype {tensor.dtype}, which machina's files never hold")
    claimed, held = tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes()
    if claimed > held:
        raise ConfigError(
            f"{where}: {entry} claims {tensor.numel()} elements (shape {list(tensor.shape)}, strides "
            f"{list(tensor.stride())}) but its storage holds {held} bytes"
        )
    return claimed
