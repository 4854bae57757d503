"""A generator that does real work on a GPU: the generator contract of docs/api.md ("The
generator binary") with PyTorch computing on the devices in CUDA_VISIBLE_DEVICES. It is
how Gantry's runner is checked on a GPU machine (tests/jobs/test_torch_generator.py);
the bundled stand-in only sleeps.

    GANTRY_GENERATOR_COMMAND="$PWD/.venv/bin/python $PWD/scripts/torch_generator.py" make up
    python scripts/torch_generator.py --params P --output-dir OUT --checkpoint-dir CK [--resume]

Params are the stand-in's (`prompt`, `seed`, `steps`, `step_seconds`): its schema fits
(`GANTRY_GENERATOR_PARAMS_SCHEMA=apps/jobs/standin_generator.params.schema.json`).
A step multiplies a 1024 x 1024 latent by a fixed matrix
`MATMULS_PER_STEP` times in bfloat16 on the GPU; `step_seconds` is the least wall time
of a step. The result, `output.png`, depends only on prompt, seed and steps, also across
resumes on the same kind of GPU: a checkpoint holds the latent and the step exactly.

Standard output as the stand-in's: `DEVICES`, `GPU <name>`, `RESUMED <step>`,
`CHECKPOINT step-<n>`, `PROGRESS <0..1>`, `OUTPUT output.png`. Exit codes: 0 success,
2 bad params, 3 no CUDA device, 137 CUDA out of memory (PyTorch's message on stderr; the
prompt `!oom` asks the allocator for twice the GPU's memory), 143 SIGTERM (the current
step is checkpointed first). GANTRY_TORCH_DEVICE=cpu runs it on the CPU (for tests on
machines without a GPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

SIZE = 1024
MATMULS_PER_STEP = 64
CHECKPOINT_NAME = "checkpoint.pt"
OUTPUT_NAME = "output.png"
CHECKPOINT_EVERY_S = 1.0  # and on SIGTERM: a checkpoint is 4 MiB


def say(line: str) -> None:
    print(line, flush=True)


def load_params(path: str) -> dict:
    """The params, checked as the stand-in checks them; exits 2 naming the bad field."""
    try:
        params = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        sys.exit(_bad(f"params: unreadable ({error})"))
    if not isinstance(params, dict):
        sys.exit(_bad("params: not a JSON object"))
    prompt = params.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        sys.exit(_bad("prompt: a non-blank string is required"))
    checks = (("seed", int, 0, 2**63 - 1, 0), ("steps", int, 1, 10_000, 10))
    for name, kind, low, high, default in (*checks, ("step_seconds", float, 0, 3600, 0.5)):
        value = params.setdefault(name, default)
        valid = isinstance(value, int | float) if kind is float else isinstance(value, int)
        if isinstance(value, bool) or not valid or not low <= value <= high:
            sys.exit(_bad(f"{name}: must be a number from {low} to {high}"))
    return params


def _bad(message: str) -> int:
    print(message, file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    params = load_params(args.params)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    # A line before the import: PyTorch and CUDA take seconds to start, silently.
    say(f"DEVICES {os.environ.get('CUDA_VISIBLE_DEVICES', 'none')}")
    import torch  # after the params: a bad request fails fast, without the import

    device = os.environ.get("GANTRY_TORCH_DEVICE", "cuda")
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch", file=sys.stderr, flush=True)
        return 3
    say(f"GPU {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'}")
    try:
        return run(torch, params, args, device=device, stopping=stopping)
    except torch.OutOfMemoryError as error:
        # The runner classifies an exit of 137 after this message as out of memory.
        print(f"torch.OutOfMemoryError: {error}", file=sys.stderr, flush=True)
        return 137


def run(torch, params: dict, args, *, device: str, stopping: list) -> int:
    if "!oom" in params["prompt"] and device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=device)  # plain allocation: fails
    digest = hashlib.sha256(f"{params['prompt']}\0{params['seed']}".encode()).digest()
    generator = torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8]) >> 1)
    weight = torch.randn(SIZE, SIZE, generator=generator, device=device) / SIZE**0.5
    weight = weight.to(torch.bfloat16)
    latent = torch.randn(SIZE, SIZE, generator=generator, device=device)
    step, steps = 0, params["steps"]
    checkpoint = Path(args.checkpoint_dir) / CHECKPOINT_NAME
    saved = None
    if args.resume and checkpoint.is_file():
        try:
            saved = torch.load(checkpoint, map_location=device)
        except Exception as error:  # unreadable: start over rather than fail every retry
            print(f"checkpoint unreadable, starting over: {error}", file=sys.stderr, flush=True)
    usable = isinstance(saved, dict) and saved.get("size") == SIZE
    if usable and 0 <= saved.get("step", -1) <= steps:
        latent, step = saved["latent"], saved["step"]
        say(f"RESUMED {step}")
    saved_at = time.monotonic()
    while step < steps:
        began = time.monotonic()
        for _ in range(MATMULS_PER_STEP):
            latent = torch.tanh((latent.to(torch.bfloat16) @ weight).float() + latent) * 0.5
        if device == "cuda":
            torch.cuda.synchronize()
        # The rest of the step's least wall time, cut short by a SIGTERM (the step's work
        # is done: it counts, and is checkpointed below).
        while not stopping and (left := began + params["step_seconds"] - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
        step += 1
        if stopping or time.monotonic() - saved_at >= CHECKPOINT_EVERY_S:
            save_checkpoint(torch, checkpoint, latent=latent, step=step)
            saved_at = time.monotonic()
        say(f"PROGRESS {step / steps:.4f}")
        if stopping and step < steps:
            return 143
    write_output(torch, latent, Path(args.output_dir) / OUTPUT_NAME)
    say(f"OUTPUT {OUTPUT_NAME}")
    say("PROGRESS 1")
    return 0


def save_checkpoint(torch, path: Path, *, latent, step: int) -> None:
    """Atomically: a temporary file renamed over the last checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save({"size": SIZE, "step": step, "latent": latent.cpu()}, temporary)
    os.replace(temporary, path)
    say(f"CHECKPOINT step-{step}")


def write_output(torch, latent, path: Path) -> None:
    """A 256 x 256 grey image of the latent's corner, written atomically."""
    from PIL import Image

    corner = latent[:256, :256].float().cpu()
    low, high = corner.min(), corner.max()
    pixels = ((corner - low) / (high - low + 1e-12) * 255).round().to(torch.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    Image.frombytes("L", (256, 256), pixels.contiguous().numpy().tobytes()).save(temporary, "PNG")
    os.replace(temporary, path)


if __name__ == "__main__":
    sys.exit(main())
