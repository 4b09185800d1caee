"""A webhook that checks nothing: the floor under what any Python fence webhook can cost.

``make bench`` (``bench/api_rows.py``) runs it as its own process beside the real webhook and
registers it for a third copy of FencedArtifact's CRD (``nullartifacts.null.fencedlease.io``).
It serves exactly as the real webhook serves (aiohttp on uvloop, the same TLS settings and
certificate, no session tickets, the startup heap frozen out of the GC, orjson) and does the
least any admission webhook must: parse the AdmissionReview and answer its ``uid``. No depth
check, no policy, no etcd read, no metrics. What a write through it costs above the plain
write is what kube-apiserver's webhook call and a Python TLS/HTTP server cost on this machine,
so the fence's own share is the fenced row minus this one (docs/performance.md, "The fenced
write: nearly free").

One exception, so the bench can tell that the API server calls it: a write whose
``spec.operationId`` (or, for a ConfigMap, ``data.probe``; for a Deployment, the annotation
``bench.fencedlease.io/probe``) is ``null-probe`` is denied.

    python bench/null_webhook.py --port 8443 --cert-dir DIR   # DIR/tls.crt, DIR/tls.key
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from fencedlease.settings import EventLoop
from fencedlease.webhook.server import MAX_BODY, NUM_TICKETS
from fencedlease.webhook.wiring import event_loop_factory, settle_heap

PATH = "/review"
PROBE = "null-probe"
PROBE_ANNOTATION = "bench.fencedlease.io/probe"


async def review(request: web.Request) -> web.Response:
    body: Any = orjson.loads(await request.read())
    req = body["request"]
    obj = req.get("object") or {}
    spec, data = obj.get("spec") or {}, obj.get("data") or {}
    notes = (obj.get("metadata") or {}).get("annotations") or {}
    allowed = (
        spec.get("operationId") != PROBE
        and data.get("probe") != PROBE
        and notes.get(PROBE_ANNOTATION) != PROBE  # a kind with neither (bench/status_rows.py)
    )
    response: dict[str, Any] = {"uid": req["uid"], "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 403, "message": "null webhook: probe denied"}
    reply = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return web.Response(body=orjson.dumps(reply), content_type="application/json")


async def serve(host: str, port: int, cert_dir: Path) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.num_tickets = NUM_TICKETS
    context.load_cert_chain(str(cert_dir / "tls.crt"), str(cert_dir / "tls.key"))
    app = web.Application(client_max_size=MAX_BODY)
    app.add_routes([web.post(PATH, review)])
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context).start()
    frozen = settle_heap()
    print(f"null webhook on https://{host}:{port}{PATH}; {frozen} objects frozen", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-dir", type=Path, required=True)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=event_loop_factory(EventLoop.UVLOOP)) as runner:
        runner.run(serve(args.host, args.port, args.cert_dir))


if __name__ == "__main__":
    main()
