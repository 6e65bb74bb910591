"""The probe_stall engine: a 100 MiB `/metrics` and 200,000 LoRA adapters in `/v1/models`.

Both bodies are built once at start (`--metrics-mib`, `--adapters`); every request
on a keep-alive connection gets one of them (404 for any other path). Run as
`python -m bench.micro.programs.stall_engine --port P`; it serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

__all__: list[str] = []


def _metrics_body(mib: int) -> bytes:
    """Plausible vLLM exposition text (histogram buckets), the gauges the router reads last."""
    lines = []
    for le in range(200):
        lines.append(
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}.0",'
            f'model_name="hostile"}} {le}\n'
        )
    block = "".join(lines).encode()
    body = block * max(1, (mib << 20) // len(block))
    return body + (
        b'vllm:num_requests_running{engine="0",model_name="hostile"} 1.0\n'
        b'vllm:num_requests_waiting{engine="0",model_name="hostile"} 2.0\n'
        b'vllm:kv_cache_usage_perc{engine="0",model_name="hostile"} 0.5\n'
    )


def _models_body(adapters: int) -> bytes:
    def card(name: str, parent: str | None) -> dict[str, object]:
        return {
            "id": name,
            "object": "model",
            "created": 1700000000,
            "owned_by": "vllm",
            "root": name if parent is None else f"/adapters/{name}",
            "parent": parent,
            "max_model_len": 4096,
            "permission": [
                {
                    "id": f"modelperm-{name}",
                    "object": "model_permission",
                    "created": 1700000000,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    cards = [card("hostile", None)] + [card(f"lora-{i}", "hostile") for i in range(adapters)]
    return json.dumps({"object": "list", "data": cards}).encode()


async def _serve_hostile(port: int, metrics_mib: int, adapters: int) -> None:
    answers = {
        b"/metrics": _metrics_body(metrics_mib),
        b"/v1/models": _models_body(adapters),
    }
    sizes = [len(answers[path]) >> 20 for path in (b"/metrics", b"/v1/models")]
    print(f"bodies: /metrics {sizes[0]} MiB, /v1/models {sizes[1]} MiB", flush=True)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                body = answers.get(path, b'{"error": "no"}')
                status = b"200 OK" if path in answers else b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % (status, len(body))
                )
                writer.write(body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--metrics-mib", type=int, default=100)
    parser.add_argument("--adapters", type=int, default=200_000)
    args = parser.parse_args()
    asyncio.run(_serve_hostile(args.port, args.metrics_mib, args.adapters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
