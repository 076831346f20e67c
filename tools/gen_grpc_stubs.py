"""Generate mqlake's stubs for ``apache.rocketmq.v2`` (the RocketMQ 5 gRPC protocol) at install time.

Run by ``make install`` with the Python of ``.venv-rmq5``, the virtual environment that holds the maintained
5.x client (PyPI ``rocketmq-python-client``) and ``grpcio-tools``.  The client ships no ``.proto`` files but its
generated ``definition_pb2.py`` / ``service_pb2.py`` embed each file's serialized ``FileDescriptorProto``: the
exact protocol definition the client speaks.  This script reads those bytes out of the installed files (parsing
them, not importing them: the client's top-level package ``rocketmq`` is also the 4.x C++ client's), renames the
files to ``broker/proxy/v2/*.proto`` so the generated modules import each other inside mqlake's namespace (the
protobuf package, ``apache.rocketmq.v2``, and so every wire name stay as they are), and hands the descriptor set
to protoc (``--descriptor_set_in``).  The output (``broker/proxy/v2/*_pb2.py``, ``.pyi`` and ``*_pb2_grpc.py``)
is not committed.  Why this route: docs/grpc.md.
"""

from __future__ import annotations

import ast
import sys
from importlib import metadata
from pathlib import Path

from google.protobuf import descriptor_pb2, duration_pb2, timestamp_pb2
from grpc_tools import protoc

DISTRIBUTION = "rocketmq-python-client"
SOURCES = ("definition", "service")  # service.proto imports definition.proto; admin.proto is not served
OUT_PACKAGE = "broker/proxy/v2"
ROOT = Path(__file__).resolve().parent.parent


def serialized_descriptor(path: Path) -> bytes:
    """The bytes literal a protoc-generated ``_pb2.py`` passes to ``AddSerializedFile``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "AddSerializedFile" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, bytes)):  # fmt: skip
            return node.args[0].value
    raise SystemExit(f"{path}: no AddSerializedFile(b'...') call: not a protoc-generated module")


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    dist = metadata.distribution(DISTRIBUTION)
    located = {Path(str(f)).name: Path(str(dist.locate_file(f))) for f in dist.files or []}
    renamed = {f"{name}.proto": f"{OUT_PACKAGE}/{name}.proto" for name in SOURCES}
    out = descriptor_pb2.FileDescriptorSet()
    for well_known in (timestamp_pb2, duration_pb2):
        well_known.DESCRIPTOR.CopyToProto(out.file.add())
    for name in SOURCES:
        path = located.get(f"{name}_pb2.py")
        if path is None:
            raise SystemExit(f"{DISTRIBUTION} {dist.version} has no {name}_pb2.py")
        fd = descriptor_pb2.FileDescriptorProto.FromString(serialized_descriptor(path))
        if fd.package != "apache.rocketmq.v2":
            raise SystemExit(f"{path}: package {fd.package!r}, expected apache.rocketmq.v2")
        fd.name = renamed[fd.name]
        fd.dependency[:] = [renamed.get(dep, dep) for dep in fd.dependency]
        out.file.append(fd)
    return out


def main() -> int:
    out_dir = ROOT / OUT_PACKAGE
    out_dir.mkdir(parents=True, exist_ok=True)
    set_path = out_dir / "descriptors.pb"
    set_path.write_bytes(descriptor_set().SerializeToString())
    args = ["protoc", f"--descriptor_set_in={set_path}", f"--python_out={ROOT}", f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}", *(f"{OUT_PACKAGE}/{name}.proto" for name in SOURCES)]  # fmt: skip
    code = protoc.main(args)
    set_path.unlink()
    if code != 0:
        print(f"protoc failed ({code})", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
