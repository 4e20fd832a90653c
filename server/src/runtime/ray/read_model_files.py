# Run by a Ray job on a node (server/src/runtime/ray/files.rs): reads a model's headers there, never its
# weights, and prints them on one line for Tessera to parse as it parses its own machine's files.
#   prefix PATH N   the first N bytes of the file PATH, and its length
#   folder PATH     PATH/config.json (at most 4 MiB) and each .safetensors file's header (its 8-byte length,
#                   then at most 64 MiB of it)
import base64, json, os, struct, sys

MAX_CONFIG = 4 << 20
MAX_HEADER = 64 << 20


def say(answer):
    print("tessera-files:" + json.dumps(answer), flush=True)
    sys.exit(0)


def b64(data):
    return base64.b64encode(data).decode("ascii")


mode, path = sys.argv[1], sys.argv[2]
try:
    is_dir = os.path.isdir(path)
    if not os.path.exists(path):
        say({"missing": True})
    if mode == "prefix":
        if is_dir:
            say({"folder": True})
        with open(path, "rb") as f:
            say({"len": os.path.getsize(path), "bytes": b64(f.read(int(sys.argv[3])))})
    if not is_dir:
        say({"file": True})
    config = None
    try:
        with open(os.path.join(path, "config.json"), "rb") as f:
            config = b64(f.read(MAX_CONFIG))
    except FileNotFoundError:
        pass
    shards = []
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(path, name), "rb") as f:
            head = f.read(8)
            if len(head) == 8 and struct.unpack("<Q", head)[0] <= MAX_HEADER:
                head += f.read(struct.unpack("<Q", head)[0])
        shards.append([name, b64(head)])
    say({"config": config, "shards": shards})
except OSError as e:
    say({"unreadable": "%s: %s" % (e.filename or path, e.strerror or e)})
