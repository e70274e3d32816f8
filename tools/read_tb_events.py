#!/usr/bin/env python3
"""tools/read_tb_events.py — prints the scalars of TensorBoard event files as `tag,step,value`
lines, read with the tensorboard package's own reader (so CRCs and the protobuf are checked by
an independent implementation). Used by tests/train/metrics_test.cpp; handy for quick looks.

usage: read_tb_events.py PATH [PATH ...]   (a file, or a directory: its *tfevents* files)
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


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
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
