"""Stand-in for the opaque GPU video generator.

Behaves like the real binary (see docs/api.md, "The generator binary") so every runner path can be
exercised without a GPU::

    gantry-standin-generator --params PARAMS.json --output-dir DIR --checkpoint-dir DIR [--resume]
    python -m apps.jobs.standin_generator ...   # same thing

Params (JSON object; unknown keys are ignored):

- ``prompt``       string, required, non-empty
- ``seed``         integer >= 0, default 0
- ``steps``        integer 1..10000, default 10
- ``step_seconds`` number 0..3600, default 0.5 (wall time per step; speed only, never output)

Standard output, one line each, flushed immediately:

- ``DEVICES <CUDA_VISIBLE_DEVICES or "none">`` once at start
- ``RESUMED <step>`` when ``--resume`` found a usable checkpoint
- ``CHECKPOINT step-<n>`` after ``checkpoint.json`` in the checkpoint dir was (atomically)
  written with ``n`` completed steps
- ``PROGRESS <0..1>`` after each completed step (``PROGRESS 1`` last on success)
- ``OUTPUT <file name>`` after the result was written

Exit codes:

- ``0``   success: exactly one file, ``output.gif`` (an animated GIF, one frame per step), in the
  output dir; the bytes depend only on prompt, seed and steps, also across resumes
- ``1``   crash (``!crash`` in the prompt: a traceback on stderr after two steps) or an
  unexpected error
- ``2``   bad input: unreadable or invalid params (stderr names the field) or bad arguments
- ``137`` ``!oom`` in the prompt: a CUDA-style out-of-memory error on stderr during the first step
- ``143`` SIGTERM (``130`` for SIGINT): the current step is checkpointed first, exit within ~0.1 s

``!hang`` in the prompt: ignores SIGTERM from the start, prints three progress lines, then never
prints or exits again (only SIGKILL ends it). ``!slow``: every step takes ten times longer.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import signal
import sys
import time
import traceback

OUTPUT_NAME = "output.gif"
CHECKPOINT_NAME = "checkpoint.json"
CHECKPOINT_VERSION = 1
TMP_MARKER = ".tmp-"  # temp files are ".<final name>.tmp-<pid>" next to the final file

DEFAULT_STEPS = 10
DEFAULT_STEP_SECONDS = 0.5
MAX_STEPS = 10_000
MAX_STEP_SECONDS = 3600.0
MAX_PROMPT_CHARS = 10_000

SLOW_FACTOR = 10
CRASH_AFTER_STEPS = 2
HANG_AFTER_STEPS = 3
SLEEP_SLICE = 0.05  # seconds; bounds how long a SIGTERM waits to be noticed

FRAME_SIZE = 96
FRAME_MS = 100

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_INPUT = 2
EXIT_OOM = 137
EXIT_SIGTERM = 143
EXIT_SIGINT = 130

OOM_MESSAGE = """\
Traceback (most recent call last):
  File "/opt/generator/pipeline.py", line 412, in denoise_step
    noise_pred = self.transformer(latents, timestep=t, encoder_hidden_states=cond)
  File "/opt/generator/models/dit.py", line 188, in forward
    attn = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.35 GiB \
total capacity; 76.12 GiB already allocated; 1.21 GiB free; 77.50 GiB reserved in total by \
PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid \
fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF
"""


class BadParams(Exception):
    """Invalid params file; the message names the field."""


class Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_received_signal: int | None = None


def _on_signal(signum: int, _frame) -> None:
    global _received_signal
    if _received_signal is None:
        _received_signal = signum


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- params


def _is_int(value) -> bool:
    """An integer as JSON Schema counts one: 7 and 7.0, not True (its params schema,
    standin_generator.params.schema.json, is what submissions are checked against)."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def load_params(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise BadParams(f"cannot read params file {path!r}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadParams(f"params file {path!r} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise BadParams("params must be a JSON object")

    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadParams(f"'prompt' must be a non-empty string (got {prompt!r})")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadParams(f"'prompt' must be at most {MAX_PROMPT_CHARS} characters")

    seed = raw.get("seed", 0)
    if not _is_int(seed) or not 0 <= seed < 2**63:
        raise BadParams(f"'seed' must be an integer between 0 and 2**63-1 (got {seed!r})")

    steps = raw.get("steps", DEFAULT_STEPS)
    if not _is_int(steps) or not 1 <= steps <= MAX_STEPS:
        raise BadParams(f"'steps' must be an integer between 1 and {MAX_STEPS} (got {steps!r})")

    step_seconds = raw.get("step_seconds", DEFAULT_STEP_SECONDS)
    if (
        isinstance(step_seconds, bool)
        or not isinstance(step_seconds, int | float)
        or not math.isfinite(step_seconds)
        or not 0 <= step_seconds <= MAX_STEP_SECONDS
    ):
        raise BadParams(
            f"'step_seconds' must be a number between 0 and {MAX_STEP_SECONDS:g} "
            f"(got {step_seconds!r})"
        )

    return {
        "prompt": prompt,
        "seed": int(seed),
        "steps": int(steps),
        "step_seconds": float(step_seconds),
    }


def params_digest(params: dict) -> str:
    """Digest of everything the output depends on (not step_seconds)."""
    key = {k: params[k] for k in ("prompt", "seed", "steps")}
    blob = json.dumps(key, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def advance_state(state: str, step: int) -> str:
    """Simulated model state after `step`, given the state after `step - 1`."""
    return hashlib.sha256(bytes.fromhex(state) + step.to_bytes(4, "big")).hexdigest()


def state_digest(pdigest: str, step: int) -> str:
    """Simulated model state after `step` steps: a hash chain, so a checkpoint can be verified."""
    state = hashlib.sha256(b"gantry-standin/1:" + pdigest.encode()).hexdigest()
    for n in range(1, step + 1):
        state = advance_state(state, n)
    return state


# --------------------------------------------------------------------------- files


def atomic_write(path: str, data: bytes, *, fsync: bool = True) -> None:
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}{TMP_MARKER}{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def remove_stale_temps(directory: str, name: str) -> None:
    """Drop temp files a killed earlier attempt may have left behind."""
    prefix = f".{name}{TMP_MARKER}"
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(prefix):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


def write_checkpoint(checkpoint_dir: str, pdigest: str, step: int, steps: int, state: str) -> str:
    doc = {
        "version": CHECKPOINT_VERSION,
        "step": step,
        "steps": steps,
        "params_digest": pdigest,
        "state_digest": state,
    }
    data = (json.dumps(doc, sort_keys=True, indent=2) + "\n").encode()
    atomic_write(os.path.join(checkpoint_dir, CHECKPOINT_NAME), data)
    label = f"step-{step}"
    emit(f"CHECKPOINT {label}")
    return label


def read_checkpoint(checkpoint_dir: str, pdigest: str, steps: int) -> int | None:
    """Completed steps in a usable checkpoint, or None (with a warning on stderr)."""
    path = os.path.join(checkpoint_dir, CHECKPOINT_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        err(f"WARNING --resume given but no checkpoint at {path}; starting from step 0")
        return None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        err(f"WARNING unreadable checkpoint {path} ({exc}); starting from step 0")
        return None
    step = doc.get("step") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("version") != CHECKPOINT_VERSION
        or doc.get("params_digest") != pdigest
        or not _is_int(step)
        or not 0 <= step <= steps
        or doc.get("state_digest") != state_digest(pdigest, step)
    ):
        err(f"WARNING checkpoint {path} does not match these params; starting from step 0")
        return None
    return step


# --------------------------------------------------------------------------- video


def _palette(prompt: str, seed: int) -> tuple[list[int], float, int]:
    h = hashlib.sha256(f"{prompt}\0{seed}".encode()).digest()
    a, b = h[0:3], h[3:6]
    # 0..127: background gradient a -> b; 128: orbiting disc; 129: bouncing square;
    # 130: progress bar; 131/132: frame-index bits (keeps consecutive frames distinct).
    pal: list[int] = []
    for i in range(128):
        pal += [a[c] + (b[c] - a[c]) * i // 127 for c in range(3)]
    pal += [255 - (a[c] + b[c]) // 2 for c in range(3)]
    pal += list(h[6:9])
    pal += [255, 255, 255]
    pal += [0, 0, 0, 255, 255, 255]
    pal += [0] * (768 - len(pal))
    phase = h[9] / 256 * 2 * math.pi
    radius = 8 + h[10] % 10
    return pal, phase, radius


def render_frames(params: dict) -> list:
    """One frame per step; frame i depends only on (prompt, seed, steps, i)."""
    from PIL import Image, ImageDraw

    size, steps = FRAME_SIZE, params["steps"]
    pal, phase, radius = _palette(params["prompt"], params["seed"])
    rows = bytes(y * 127 // (size - 1) for y in range(size) for _ in range(size))
    base = Image.frombytes("P", (size, size), rows)
    base.putpalette(pal)

    frames = []
    for i in range(steps):
        frame = base.copy()
        draw = ImageDraw.Draw(frame)
        angle = phase + 2 * math.pi * i / steps
        cx = round(size / 2 + (size / 2 - radius - 4) * math.cos(angle))
        cy = round(size / 2 + (size / 2 - radius - 8) * math.sin(angle))
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=128)
        travel = size - 16
        pos = (i * 4) % (2 * travel)
        sx = pos if pos < travel else 2 * travel - pos
        draw.rectangle((sx, size // 2 - 6, sx + 12, size // 2 + 6), fill=129)
        bar = (i + 1) * size // steps
        if bar > 0:
            draw.rectangle((0, size - 5, bar - 1, size - 3), fill=130)
        for bit in range(16):
            frame.putpixel((bit, size - 1), 132 if (i >> bit) & 1 else 131)
        frames.append(frame)
    return frames


def encode_gif(frames: list) -> bytes:
    buf = io.BytesIO()
    frames[0].save(
        buf,
        format="GIF",
        save_all=True,
        append_images=frames[1:],
        duration=FRAME_MS,
        loop=0,
    )
    return buf.getvalue()


# --------------------------------------------------------------------------- run


def sleep_step(seconds: float) -> None:
    """Sleep at least `seconds`, in slices, raising Terminated as soon as a signal arrives."""
    deadline = time.monotonic() + seconds
    while True:
        if _received_signal is not None:
            raise Terminated(_received_signal)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(min(SLEEP_SLICE, remaining))


def hang_forever() -> None:
    while True:  # SIGTERM is ignored; only SIGKILL ends this
        time.sleep(3600)


def simulated_crash(step: int) -> None:
    raise RuntimeError(f"simulated generator crash at step {step} (prompt contains '!crash')")


def run(args: argparse.Namespace) -> int:
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    emit(f"DEVICES {devices or 'none'}")

    params = load_params(args.params)
    prompt, steps = params["prompt"], params["steps"]
    crash, hang, oom = "!crash" in prompt, "!hang" in prompt, "!oom" in prompt
    step_seconds = params["step_seconds"] * (SLOW_FACTOR if "!slow" in prompt else 1)
    if hang:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    os.makedirs(args.output_dir, exist_ok=True)
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    remove_stale_temps(args.output_dir, OUTPUT_NAME)
    remove_stale_temps(args.checkpoint_dir, CHECKPOINT_NAME)

    pdigest = params_digest(params)
    step = 0
    if args.resume:
        found = read_checkpoint(args.checkpoint_dir, pdigest, steps)
        if found is not None:
            step = found
            emit(f"RESUMED {step}")
    state = state_digest(pdigest, step)

    ran = 0
    try:
        while step < steps:
            sleep_step(step_seconds)
            if oom:
                err(OOM_MESSAGE.rstrip("\n"))
                return EXIT_OOM
            step += 1
            ran += 1
            state = advance_state(state, step)
            write_checkpoint(args.checkpoint_dir, pdigest, step, steps, state)
            emit(f"PROGRESS {step / steps:.4f}".rstrip("0").rstrip("."))
            if crash and ran >= CRASH_AFTER_STEPS:
                simulated_crash(step)
            if hang and ran >= HANG_AFTER_STEPS:
                hang_forever()
        if crash:
            simulated_crash(step)
        if hang:
            hang_forever()
        if _received_signal is not None:
            raise Terminated(_received_signal)
    except Terminated as exc:
        write_checkpoint(args.checkpoint_dir, pdigest, step, steps, state)
        name = signal.Signals(exc.signum).name
        err(f"received {name} at step {step}/{steps}; checkpoint written, exiting")
        return EXIT_SIGTERM if exc.signum == signal.SIGTERM else EXIT_SIGINT

    if ran == 0:
        emit("PROGRESS 1")  # resumed from a final checkpoint: still end on 1
    data = encode_gif(render_frames(params))
    atomic_write(os.path.join(args.output_dir, OUTPUT_NAME), data)
    emit(f"OUTPUT {OUTPUT_NAME}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gantry-standin-generator",
        description="Stand-in for the GPU video generator (see module docstring).",
    )
    parser.add_argument("--params", required=True, help="path to the params JSON file")
    parser.add_argument("--output-dir", required=True, help="where the one output file goes")
    parser.add_argument("--checkpoint-dir", required=True, help="where checkpoints go")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    return parser


def main(argv: list[str] | None = None) -> int:
    global _received_signal
    args = build_parser().parse_args(argv)  # exits 2 on bad arguments
    _received_signal = None
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return run(args)
    except BadParams as exc:
        err(f"error: invalid params: {exc}")
        return EXIT_BAD_INPUT
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
