"""llama.cpp's own HTTP server (PyPI's xllamacpp) on CPU: the real engine of the tests.

    python serve.py --model PATH --host HOST --port PORT [--alias NAME]

Serves /health, /v1/chat/completions, /v1/completions, /v1/models, /metrics until SIGTERM or SIGINT.
"""
import argparse
import signal

import xllamacpp

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--alias", help="the name it answers under (the weights' path without it)")
args = parser.parse_args()

params = xllamacpp.CommonParams()
params.model.path = args.model
if args.alias:
    params.model_alias = {args.alias}
params.hostnames = [args.host]
params.port = args.port
params.n_ctx = 256
params.n_predict = 16
params.cpuparams.n_threads = 1
params.warmup = False
server = xllamacpp.Server(params)
print(f"llama.cpp serving {args.model} on {server.listening_address}", flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
print("stopping", flush=True)
