"""The codec compiles each class's emitters on their first use (issue 36).

Importing ``fanfold.db`` used to compile six emitters for each of ~70 classes (0.15 G
instructions in every process, `ls` and `show` included, which encode nothing). Each
slot of a class's codec now holds a stand-in that compiles the real emitter, puts it in
the slot and calls it, so that the step's hot path calls the compiled function itself.
"""

from __future__ import annotations

import subprocess
import sys

from fanfold.db import codec
from fanfold.statemachine import Usage

COUNT_COMPILED = """
import builtins
compiled = []
real = builtins.compile
def counting(source, filename, *args, **kwargs):
    compiled.append(str(filename))
    return real(source, filename, *args, **kwargs)
builtins.compile = counting
import fanfold.db.codec  # (``import fanfold.db`` alone no longer imports the codec)
print(sum(1 for name in compiled if name.startswith("<fanfold.db.codec")))
"""


def test_importing_the_log_compiles_no_emitter() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COUNT_COMPILED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]


def test_every_emitter_of_every_class_compiles_and_replaces_its_stand_in() -> None:
    """What import-time compilation used to check (every field's type is one the codec
    can write), and that a built slot holds the compiled function, not the stand-in."""
    for cls, class_codec in codec._CODECS.items():
        for slot in codec._EMITTER_SLOTS:
            emit = class_codec.built(slot)
            assert getattr(class_codec, slot) is emit, (cls, slot)
            assert slot not in class_codec.pending
    # The compiled functions, called directly (a memoised class's behind its memo).
    text = codec._CODECS[Usage].compact_stored(Usage(input_tokens=3, output_tokens=1))
    assert text.startswith("[") and "Usage" in text
    stored = codec._CODECS[Usage].compact_stored
    assert stored.__code__.co_filename.startswith("<fanfold.db.codec"), stored


def test_a_stand_in_compiles_once_then_leaves_the_slot() -> None:
    code = (
        "from fanfold.db import codec\n"
        "from fanfold.statemachine import Usage\n"
        "c = codec._CODECS[Usage]\n"
        "stand_in = c.document\n"
        "first = c.document(Usage(input_tokens=3, output_tokens=1))\n"
        "assert c.document is not stand_in and 'document' not in c.pending\n"
        "assert c.document(Usage(input_tokens=3, output_tokens=1)) == first\n"
        "print(first)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"type":"Usage"' in done.stdout and '"input_tokens":3' in done.stdout


def test_the_codec_reads_each_class_annotations_as_typing_does() -> None:
    """The codec evaluates each annotation text once per module instead of calling
    ``typing.get_type_hints`` per class: the same types, for every class it knows."""
    import typing

    for cls, class_codec in codec._CODECS.items():
        assert class_codec.hints == typing.get_type_hints(cls), cls
