#!/usr/bin/env python3
"""tools/read_tb_events.py — prints the scalars of TensorBoard event files as `tag,step,value`
lines, read with the tensorboard package's own reader (so CRCs and the protobuf are checked by
an independent implementation). Used by tests/train/metrics_test.cpp; handy for quick looks.

usage: read_tb_events.py PATH [PATH ...]   (a file, or a directory: its *tfevents* files)
       read_tb_events.py --run DIR            (DIR read as TensorBoard shows one run: its event
                                               files merged, a restart's replayed steps purged;
                                               lines sorted by tag, then step)
Needs `pip install tensorboard` (TensorFlow is not required). Writes nothing.
"""
import os
import sys

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util


def event_files(path):
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if "tfevents" in n)
        return [os.path.join(path, n) for n in names]
    return [path]


def scalar_value(value):
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor"):  # EventFileLoader migrates simple_value to a scalar tensor
        return float(tensor_util.make_ndarray(value.tensor).item())
    return None


def print_run(path):
    from tensorboard.backend.event_processing import event_accumulator as ea
    acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    rows = []
    for tag in acc.Tags().get("scalars", []):
        rows += [(tag, e.step, float(e.value)) for e in acc.Scalars(tag)]
    for tag in acc.Tags().get("tensors", []):
        rows += [(tag, e.step, float(tensor_util.make_ndarray(e.tensor_proto).item()))
                 for e in acc.Tensors(tag)]
    for tag, step, v in sorted(rows, key=lambda r: (r[0], r[1])):
        print(f"{tag},{step},{v:.9g}")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "--run":
        print_run(argv[2])
        return 0
    for path in argv[1:]:
        for f in event_files(path):
            for event in EventFileLoader(f).Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    v = scalar_value(value)
                    if v is not None:
                        print(f"{value.tag},{event.step},{v:.9g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
