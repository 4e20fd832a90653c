"""llama.cpp's own HTTP server (PyPI's xllamacpp) on CPU: the real engine of the tests.

    python serve.py --model PATH --host HOST --port PORT [--alias NAME] [-c N] [-np N] [-ngl N] [-cram MIB]

Serves /health, /v1/chat/completions, /v1/completions, /v1/models, /metrics until SIGTERM or SIGINT. Takes
llama-server's own spellings too (-m, -a, --ctx-size, --parallel), so that it stands in for llama-server in
the `llamacpp` recipe; -ngl is taken and ignored (this is CPU). With -c it logs llama.cpp's own lines (the
buffers it allocated); without it, a context of 256. -cram (llama-server's --cache-ram) bounds the host
memory its prompt cache keeps beside its slots (0: each slot's last prompt alone, as a GPU's KV cache bounds
an engine's).
"""
import argparse
import signal

import xllamacpp

parser = argparse.ArgumentParser()
parser.add_argument("-m", "--model", required=True)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("-a", "--alias", help="the name it answers under (the weights' path without it)")
parser.add_argument("-c", "--ctx-size", type=int)
parser.add_argument("-np", "--parallel", type=int)
parser.add_argument("-ngl", "--n-gpu-layers", type=int)
parser.add_argument("-cram", "--cache-ram", type=int)
args = parser.parse_args()

params = xllamacpp.CommonParams()
params.model.path = args.model
if args.alias:
    params.model_alias = {args.alias}
params.hostnames = [args.host]
params.port = args.port
params.n_ctx = args.ctx_size or 256
if args.parallel:
    params.n_parallel = args.parallel
if args.cache_ram is not None:
    params.cache_ram_mib = args.cache_ram
if args.ctx_size:
    params.verbosity = 4
    params.fit_params = False
params.n_predict = 16
params.cpuparams.n_threads = 1
params.warmup = False
server = xllamacpp.Server(params)
print(f"llama.cpp serving {args.model} on {server.listening_address}", flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
print("stopping", flush=True)
