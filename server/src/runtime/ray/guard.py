# Run by an engine's Ray job on its node (server/src/runtime/ray/mod.rs): the engine listens on the node's
# loopback, and this guard on the node's address lets through only requests that carry the engine's key
# (Authorization: Bearer $TESSERA_ENGINE_KEY), on every path. An engine's own --api-key guards some paths
# alone (vLLM's /v1, not /invocations, /pooling, /score, /rerank, /classify or /tokenize).
#   guard.py PORT_TAKEN CANNOT_LISTEN HOST PORT ENGINE_PORT -- COMMAND...
# Exits as the engine exits, with its status. One request per connection: each is checked, framed by its
# own Content-Length or chunks, and sent on with Connection: close, so nothing unchecked follows it.
import asyncio, ctypes, errno, hmac, os, signal, socket, subprocess, sys

port_taken, cannot_listen = int(sys.argv[1]), int(sys.argv[2])
host, port, engine_port = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
command = sys.argv[7:]
key = os.environ.get("TESSERA_ENGINE_KEY", "").encode()
MAX_HEAD = 64 << 10
HEAD_WITHIN_S = 60
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"upgrade", b"te"}


def listen(on_host, on_port):
    s = socket.socket(socket.AF_INET6 if ":" in on_host else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((on_host, on_port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(f"tessera: port {on_port} is taken on this node: the engine starts again on another", file=sys.stderr)
            sys.exit(port_taken)
        print(f"tessera: this node cannot listen on {on_host}:{on_port}: {e.strerror}", file=sys.stderr)
        sys.exit(cannot_listen)
    return s


def answer(status, reason, message):
    body = ('{"error": {"message": "%s", "type": "invalid_request_error", "code": %d}}' % (message, status)).encode()
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        status, reason.encode(), len(body), body)


def keyed(value):
    scheme, _, token = value.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)


async def relay_chunks(reader, upstream):
    while True:
        line = await reader.readuntil(b"\r\n")
        upstream.write(line)
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:
                trailer = await reader.readuntil(b"\r\n")
                upstream.write(trailer)
                if trailer == b"\r\n":
                    return
        upstream.write(await reader.readexactly(size + 2))
        await upstream.drain()


async def relay_body(reader, upstream, length, chunked):
    if chunked:
        await relay_chunks(reader, upstream)
    while length > 0:
        data = await reader.read(min(length, 1 << 16))
        if not data:
            raise ConnectionError("the request ended inside its body")
        upstream.write(data)
        await upstream.drain()
        length -= len(data)


async def relay_answer(from_engine, client):
    while data := await from_engine.read(1 << 16):
        client.write(data)
        await client.drain()


async def serve(reader, writer):
    upstream = None
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_WITHIN_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            return
        request_line, *lines = head[:-4].split(b"\r\n")
        fields = []
        for line in lines:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                writer.write(answer(400, "Bad Request", "a header line is malformed"))
                return
            fields.append((name.lower(), value.strip(), line))
        keys = [v for n, v, _ in fields if n == b"authorization"]
        if len(keys) != 1 or not keyed(keys[0]):
            writer.write(answer(401, "Unauthorized", "this engine takes requests from Tessera alone: send them to Tessera's gateway"))
            return
        lengths = {v for n, v, _ in fields if n == b"content-length"}
        codings = [v.lower() for n, v, _ in fields if n == b"transfer-encoding"]
        chunked = codings == [b"chunked"]
        if (codings and not chunked) or len(lengths) > 1 or (chunked and lengths) or not all(v.isdigit() for v in lengths):
            writer.write(answer(400, "Bad Request", "the request's body is framed ambiguously"))
            return
        length = int(lengths.pop()) if lengths else 0
        try:
            from_engine, upstream = await asyncio.open_connection("127.0.0.1", engine_port)
        except OSError:
            writer.write(answer(502, "Bad Gateway", "the engine does not answer yet"))
            return
        kept = [line for n, _, line in fields if n not in HOP_BY_HOP]
        upstream.write(b"\r\n".join([request_line, *kept, b"Connection: close", b"", b""]))
        sending = asyncio.ensure_future(relay_body(reader, upstream, length, chunked))
        try:
            await relay_answer(from_engine, writer)
        finally:
            sending.cancel()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        for w in (upstream, writer):
            if w is not None:
                try:
                    await w.drain()
                except ConnectionError:
                    pass
                w.close()


def end_with_this_guard():
    # The engine gets SIGTERM should the guard be killed outright: it never runs unguarded.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


async def main():
    if not key:
        print("tessera: the engine's guard was given no key: the engine is not started", file=sys.stderr)
        return cannot_listen
    public = listen(host, port)
    listen("127.0.0.1", engine_port).close()
    loop = asyncio.get_running_loop()
    # Ray signals every process of a job, the engine included: the guard forwards nothing (a second
    # SIGTERM makes llama.cpp end at once), and serves what the engine answers until it ends.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: None)
    try:
        engine = subprocess.Popen(command, preexec_fn=end_with_this_guard)
    except OSError as e:
        print(f"tessera: {command[0]} cannot be run on this node: {e.strerror}", file=sys.stderr)
        return 127
    server = await asyncio.start_server(serve, sock=public, limit=MAX_HEAD, backlog=512)
    code = await loop.run_in_executor(None, engine.wait)
    server.close()
    return 128 - code if code < 0 else code


sys.exit(asyncio.run(main()))
