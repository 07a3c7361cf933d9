"""Runtime check that no kvserve process unpickles anything (tests/reliability).

Put on PYTHONPATH with KVSERVE_PICKLE_AUDIT=FILE in the environment: every
unpickling in this process (pickle.load/loads/Unpickler, and the interpreter's
`pickle.find_class` audit event, which also sees the C unpickler) appends one
line to FILE naming the process and the Python call site. Data arriving on a
socket must never reach an unpickler; the test asserts FILE stays empty.
"""
import os
import sys

_PATH = os.environ.get("KVSERVE_PICKLE_AUDIT")

if _PATH:
    import pickle
    import traceback

    def _record(what):
        frames = traceback.extract_stack(limit=8)[:-2]
        where = " <- ".join(f"{f.name}" for f in reversed(frames))
        try:
            with open(_PATH, "a", encoding="utf-8") as out:
                out.write(f"pid={os.getpid()} {what} via {where} argv={' '.join(getattr(sys, 'argv', [])[:3])}\n")
        except OSError:
            pass

    def _hook(event, args):
        if event == "pickle.find_class":
            _record(f"find_class {args[0]}.{args[1]}")

    sys.addaudithook(_hook)
    _loads, _load, _Unpickler = pickle.loads, pickle.load, pickle.Unpickler

    def loads(*a, **k):
        _record("pickle.loads")
        return _loads(*a, **k)

    def load(*a, **k):
        _record("pickle.load")
        return _load(*a, **k)

    class Unpickler(_Unpickler):
        def __init__(self, *a, **k):
            _record("pickle.Unpickler")
            super().__init__(*a, **k)

    pickle.loads, pickle.load, pickle.Unpickler = loads, load, Unpickler
    try:  # proof that the guard is active in this process
        with open(_PATH + ".loaded", "a", encoding="utf-8") as out:
            out.write(f"pid={os.getpid()} argv={' '.join(getattr(sys, 'argv', [])[:3])}\n")
    except OSError:
        pass
