"""Reads TensorBoard event files back with the real `tensorboard` package, for the fixture of
test/tracking/tensorboard.test.ts (the test suite itself runs without Python).

Run from the repository root, with tensorboard installed (e.g. a venv at /work/venv: pip
install tensorboard):

    SEARCHR1_WRITE_FIXTURES=1 npx vitest run test/tracking/tensorboard.test.ts
    /work/venv/bin/python test/tracking/read_tfevents.py test/tracking/fixtures/tensorboard/events \
        > test/tracking/fixtures/tensorboard/read-back.json

The first line rewrites the event files with src/tracking/tensorboard.ts (two processes of one
run, the second resuming); this reads them as TensorBoard's server does, twice: through
event_accumulator (Scalars) and plugin_event_accumulator (Tensors, the path the scalars
dashboard takes), which must agree, and prints every scalar as [step, value, wall_time] per
tag. Both accumulators purge orphaned data as TensorBoard does by default, so the resumed
process's SessionLog START drops the first process's points from that step on.
"""

import json
import os
import sys

import tensorboard
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.util import tensor_util


def main(folder: str) -> None:
    classic = event_accumulator.EventAccumulator(
        folder, size_guidance={event_accumulator.SCALARS: 0}
    )
    classic.Reload()
    scalars = {
        tag: [[e.step, e.value, e.wall_time] for e in classic.Scalars(tag)]
        for tag in sorted(classic.Tags()["scalars"])
    }
    plugin = plugin_event_accumulator.EventAccumulator(
        folder, size_guidance={plugin_event_accumulator.TENSORS: 0}
    )
    plugin.Reload()
    tensors = {
        tag: [
            [e.step, float(tensor_util.make_ndarray(e.tensor_proto).item()), e.wall_time]
            for e in plugin.Tensors(tag)
        ]
        for tag in sorted(plugin.Tags()["tensors"])
    }
    if tensors != scalars:
        raise SystemExit(f"the two readers disagree:\n{scalars}\n{tensors}")
    out = {
        "tensorboard": tensorboard.__version__,
        "files": sorted(f for f in os.listdir(folder) if "tfevents" in f),
        "scalars": scalars,
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
