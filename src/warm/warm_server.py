# ctrun's warm worker server (ctrun --warm). ctrun embeds this file and runs it as
#   <interpreter> <the workers' interpreter flags> -c <this file> <control fd> <preload json> <target>
# (the target: the script, -m:<module>, or -c:<the argument after the code>, --run_path's script)
# under the workers' interpreter, flags and common environment. It imports the preload list once,
# then forks worker processes on request; each waits for its worker spec from ctrun and runs the
# script as `python script.py` / `python -m module` / `python -c code` would.
#
# Process tree and reaping (the race analysis):
#   ctrun (child subreaper) -> server -> intermediate -> worker
# The server forks an intermediate, which forks the worker, opens the worker's pidfd while it is
# still the worker's parent (nobody can have reaped the worker, so the pidfd is the worker's), hands
# the pidfd to the server and exits. The server reaps the intermediate: the kernel reparents the
# worker to the nearest subreaper, ctrun, before the intermediate becomes reapable, so when the
# server sends the pidfd on to ctrun the worker is already ctrun's child and only ctrun can reap it.
# A worker that dies before it is given a spec is reaped by ctrun as an unknown child; ctrun sees it
# through the pidfd (readable) and never hands it a spec.
#
# Safety rules: the server forks only while it has exactly one thread and neither CUDA nor a process
# group is initialised; it reports the broken rule instead of forking and ctrun starts workers cold.
# Children re-read what libraries read at import time, reseed the random generators from fresh
# entropy, and exit like the interpreter does (threads joined, atexit run, files flushed) but
# through os._exit, so no copy-on-write storm and no slow teardown.
import ast
import atexit
import ctypes
import gc
import importlib
import io
import json
import os
import select
import signal
import socket
import struct
import sys
import threading

CTL_FD = int(sys.argv[1])
PRELOAD = json.loads(sys.argv[2])
TARGET = sys.argv[3] if len(sys.argv) > 3 else ""
SERVER_ENV = dict(os.environ)
SELF_FILES = ("<ctrun-warm>", "<string>")  # this file, and the -c line that runs it
UNBUFFERED = isinstance(getattr(sys.stdout, "buffer", None), io.FileIO)  # -u or PYTHONUNBUFFERED
# `-c` put "" (the working directory) first on sys.path, unless -P, -I or PYTHONSAFEPATH said not
# to. It goes now, so that no module in the working directory shadows what the server imports; a
# worker puts its own first entry back as `python script.py` / `python -m` would (run_worker).
SCRIPT_SLOT = not getattr(sys.flags, "safe_path", False) and bool(sys.path) and sys.path[0] == ""
if SCRIPT_SLOT:
    del sys.path[0]
PR_SET_PDEATHSIG = 1

libc = ctypes.CDLL(None, use_errno=True)
ctl = socket.socket(fileno=CTL_FD)
ctl.set_inheritable(False)


def send(obj, fds=()):
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(ctl, [data], list(fds))
    else:
        ctl.send(data)


def set_cmdline(text):
    """What ps, top and pgrep -f show for this process: `text`, written over the interpreter's
    argument area as setproctitle does (its last byte made non-NUL, so /proc/PID/cmdline is
    `text` up to its first NUL). The kernel shows at most one page (4 KB) of a command line
    rewritten this way: a longer one is cut there. The arguments show joined by spaces, as ps
    shows a cold worker's; a tool that splits /proc/PID/cmdline at NULs sees one argument."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # fields[0] is stat's field 3
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
        size = end - start
        if size < 2:
            return
        raw = text.encode("utf-8", "surrogateescape")[:size - 2]
        ctypes.memmove(start, raw + b"\0" * (size - 1 - len(raw)) + b" ", size)
    except (OSError, ValueError, IndexError):
        pass


def thread_count():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def mapped_files(wanted):
    """The paths of the files mapped into this process whose base name `wanted` accepts, each
    once, in the order of /proc/self/maps; none when it cannot be read."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if "/" in line else ""
                if path and path not in paths and wanted(os.path.basename(path)):
                    paths.append(path)
    except OSError:
        pass
    return paths


CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_driver_initialised():
    """True when the CUDA driver (libcuda) is initialised (cuInit was called, by the CUDA runtime's
    first call or a library's own), which a forked child cannot use, even when torch never
    initialised CUDA itself (a library that asked torch.cuda.is_available() at import). Being
    mapped is not enough: every CUDA build of torch 2.x maps libcuda at `import torch` (a library
    of torch's links it) without calling it. The driver says which without changing anything:
    cuCtxGetCurrent answers CUDA_ERROR_NOT_INITIALIZED until cuInit. A libcuda that cannot be asked
    counts as initialised. NVML, which torch.cuda.device_count() may use because it leaves fork
    safe, maps libnvidia-ml only."""
    for path in mapped_files(lambda name: name.startswith("libcuda.so")):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            ctx = ctypes.c_void_p()
            if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != CUDA_ERROR_NOT_INITIALIZED:
                return True
        except (OSError, AttributeError):
            return True
    return False


def unsafe_reason():
    """The first safety rule the server breaks, or ""."""
    n = thread_count()
    if n != 1:
        return "the warm server has %d threads (a preloaded module started threads or ran parallel work)" % n
    if cuda_driver_initialised():
        return "CUDA was initialised while preloading (the CUDA driver, libcuda, is initialised)"
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return "CUDA was initialised while preloading"
        except Exception:
            pass
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                return "a torch.distributed process group was initialised while preloading"
        except Exception:
            pass
    return ""


def script_imports(path):
    """Top-level absolute imports of the script (not its own directory's modules)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def under(path, roots):
    """Whether the real path `path` is one of the directories `roots` or lies below one: the
    script's own code (its directory, the working directory) rather than an installed package."""
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def with_script_entry(entry, fn):
    """fn() with `entry` first on sys.path, as the worker will have it (nothing when safe-path)."""
    if not SCRIPT_SLOT:
        return fn()
    sys.path.insert(0, entry)
    try:
        return fn()
    finally:
        sys.path.pop(0)


def installed_elsewhere(name, script_dir):
    """Whether the top-level module `name` resolves, with the worker's sys.path[0] (the script's
    directory), to code outside the script's directory and the working directory: an installed
    package, which reads nothing rank-specific at import. The script's own modules are left to the
    worker, as a cold start would import them: they may read RANK or LOCAL_RANK at import, and a
    module of the same name in the server's working directory must not shadow them."""
    import importlib.util
    try:
        spec = with_script_entry(script_dir, lambda: importlib.util.find_spec(name.split(".")[0]))
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    where = spec.origin if spec.origin not in (None, "built-in", "frozen") else None
    if where is None and spec.submodule_search_locations:
        where = list(spec.submodule_search_locations)[0]
    if where is None:
        return spec.origin in ("built-in", "frozen")
    return not under(os.path.realpath(where), {script_dir, os.path.realpath(os.getcwd())})


# --- OpenBLAS: its thread pool starts when the library loads ----------------------------------
# OpenBLAS (numpy's BLAS in its wheels, which `import torch` loads) starts its pool of worker
# threads when the library is loaded, one per CPU unless OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or
# OMP_NUM_THREADS says otherwise: a server that preloaded it would have many threads and never
# fork. So the server preloads with OPENBLAS_NUM_THREADS=1 (no pool), and each worker sets the
# number a cold worker's OpenBLAS would have read from the worker's environment at its load.
OPENBLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
OPENBLAS_SETTERS = []  # set_num_threads of every OpenBLAS loaded by the preload


def leading_int(text):
    digits = ""
    for ch in text.strip():
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else 0


def openblas_threads(env):
    """The pool size OpenBLAS takes at load from `env`: the first positive of its variables, else
    one per CPU this process may run on."""
    for key in OPENBLAS_VARIABLES:
        n = leading_int(env.get(key, ""))
        if n > 0:
            return n
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def find_openblas_setters():
    """set_num_threads of each OpenBLAS library now mapped: its symbol carries the build's prefix
    ("scipy_" in numpy's wheels) and integer-size suffix ("64_")."""
    setters = []
    for path in mapped_files(lambda name: "openblas" in name and ".so" in name):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("", "scipy_"):
            for suffix in ("", "64_", "_64"):
                fn = getattr(lib, prefix + "openblas_set_num_threads" + suffix, None)
                if fn is not None:
                    fn.argtypes, fn.restype = [ctypes.c_int], None
                    setters.append(fn)
                    break
            else:
                continue
            break
    return setters


def apply_openblas_threads(env):
    n = openblas_threads(env)
    if n > 1:
        for fn in OPENBLAS_SETTERS:
            fn(n)


def preload():
    # Loaded now, OpenBLAS reads this: no pool in the server (see OPENBLAS_VARIABLES). The server's
    # own value comes back afterwards; each worker gets its own environment anyway.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        return preload_modules()
    finally:
        if "OPENBLAS_NUM_THREADS" in SERVER_ENV:
            os.environ["OPENBLAS_NUM_THREADS"] = SERVER_ENV["OPENBLAS_NUM_THREADS"]
        else:
            del os.environ["OPENBLAS_NUM_THREADS"]
        OPENBLAS_SETTERS[:] = find_openblas_setters()


def preload_modules():
    mods = []
    for name in PRELOAD:
        if name == "@script":
            script = "" if TARGET.startswith("-m:") else TARGET[3:] if TARGET.startswith("-c:") else TARGET
            if script:
                script_dir = os.path.dirname(os.path.realpath(script))
                mods += [(m, False) for m in script_imports(script) if installed_elsewhere(m, script_dir)]
        else:
            mods.append((name, True))
    for name, required in mods:
        try:
            importlib.import_module(name)
        except BaseException as e:  # a preload must never kill the server silently
            if required:
                return "cannot preload %s: %s: %s" % (name, type(e).__name__, e)
    return ""


# --- stale code: inotify on the directories of every loaded module file -------------------------
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000


class Staleness:
    def __init__(self):
        self.files = set()
        self.wd_dir = {}
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        self.stale = ""
        for m in list(sys.modules.values()):
            f = getattr(m, "__file__", None)
            if isinstance(f, str) and os.path.isabs(f):
                self.files.add(os.path.realpath(f))
        if self.fd < 0:
            return
        mask = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        for d in sorted({os.path.dirname(f) for f in self.files}):
            wd = libc.inotify_add_watch(self.fd, d.encode(), mask)
            if wd >= 0:
                self.wd_dir[wd] = d

    def check(self):
        """The first loaded file changed on disk since the preload, or "". Reads every queued
        event: fsnotify queues them in the writer's system call, so a change that completed before
        ctrun asked is seen."""
        while not self.stale and self.fd >= 0:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            off = 0
            while off + 16 <= len(buf):
                wd, _mask, _cookie, n = struct.unpack_from("iIII", buf, off)
                name = buf[off + 16:off + 16 + n].split(b"\0", 1)[0].decode(errors="replace")
                off += 16 + n
                path = os.path.join(self.wd_dir.get(wd, ""), name)
                if path in self.files and not self.stale:
                    self.stale = path
        return self.stale


# --- the worker side -----------------------------------------------------------------------------
def make_stdio():
    """sys.stdin/stdout/stderr as the interpreter creates them at start-up for fds 0-2 (CPython's
    create_stdio on POSIX): stdin always buffered, stdout/stderr unbuffered under -u; newline "\n"
    (no translation); line buffering on a terminal, and always for stderr; a `mode` attribute."""
    unbuffered = UNBUFFERED
    if sys.stdout is not None:
        enc = sys.stdout.encoding
    else:  # the server started with fd 1 closed: the locale's, by its normalised name as at start-up
        import codecs
        import locale
        enc = codecs.lookup(locale.getpreferredencoding(False)).name
    errs = sys.stdout.errors if sys.stdout is not None else "strict"

    def one(fd, write):
        try:
            os.fstat(fd)
        except OSError:
            return None
        buffering = 0 if unbuffered and write else -1
        buf = io.open(fd, "wb" if write else "rb", buffering, closefd=False)
        raw = buf if buffering == 0 else buf.raw
        raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
        line = (not unbuffered) and (os.isatty(fd) or fd == 2)
        stream = io.TextIOWrapper(buf, encoding=enc, errors="backslashreplace" if fd == 2 else errs, newline="\n",
                                  line_buffering=line, write_through=unbuffered)
        stream.mode = "w" if write else "r"
        return stream

    sys.stdin = sys.__stdin__ = one(0, False)
    sys.stdout = sys.__stdout__ = one(1, True)
    sys.stderr = sys.__stderr__ = one(2, True)


# Whether the worker's code has imported torch (an `import` statement naming torch or a
# submodule, its own or a library's): from then on a cold worker's torch has read OMP_NUM_THREADS,
# and setting the variable changes nothing. Watched through builtins.__import__ until then.
TORCH_IMPORTED = False


def watch_torch_import():
    import builtins
    original = builtins.__import__

    def watching(name, *args, **kwargs):
        global TORCH_IMPORTED
        if name == "torch" or name.startswith("torch."):
            TORCH_IMPORTED = True
            if builtins.__import__ is watching:  # not if the script put a hook of its own on top
                builtins.__import__ = original
        return original(name, *args, **kwargs)
    builtins.__import__ = watching


def apply_omp_num_threads(value):
    # torch reads OMP_NUM_THREADS when its thread pool first starts, in the child: only a value
    # other than the server's needs telling (set_num_threads starts OpenMP: ~20 ms).
    torch = sys.modules.get("torch")
    if torch is not None and value != SERVER_ENV.get("OMP_NUM_THREADS", "") and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def apply_omp_num_threads_set(value):
    if not TORCH_IMPORTED:  # a cold script's torch reads it at its import, not later
        apply_omp_num_threads(value)


def rereader(module, function):
    """An action that calls module.function() (which reads the environment again), when that module
    is loaded and has it; its failure changes nothing."""
    def apply(_value):
        fn = getattr(sys.modules.get(module), function, None)
        if fn is not None:
            try:
                fn()
            except Exception:
                pass
    return apply


# Variables the preloaded modules read once at import, and how a worker applies its own value:
# at the start from its environment, and again when the script sets one (a cold script that sets
# OMP_NUM_THREADS before `import torch` gets that many threads, and one that sets it after does
# not; here torch is imported already).
REREAD = {"OMP_NUM_THREADS": apply_omp_num_threads,
          "TORCH_DISTRIBUTED_DEBUG": rereader("torch.distributed", "set_debug_level_from_env"),
          "TORCH_LOGS": rereader("torch._logging", "_init_logs")}
REREAD_ON_SET = dict(REREAD, OMP_NUM_THREADS=apply_omp_num_threads_set)


class RereadingEnviron(type(os.environ)):
    """os.environ of a worker: a write of a REREAD variable is applied as an import would read it.
    Named as the class it extends: type(os.environ) reads os._Environ, as in a cold worker."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        action = REREAD_ON_SET.get(key)
        if action is not None:
            action(value)


RereadingEnviron.__name__ = RereadingEnviron.__qualname__ = "_Environ"
RereadingEnviron.__module__ = "os"


def reread_environment(env):
    """What libraries read at import time, read again from the worker's environment."""
    torch = sys.modules.get("torch")
    if torch is not None:
        for key, action in REREAD.items():
            if key == "OMP_NUM_THREADS" or key in env:
                action(env.get(key, ""))
    apply_openblas_threads(env)
    # Generators: fresh entropy in every child (every rank and every attempt differ).
    import random
    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass
    if torch is not None:
        torch.seed()
    # multiprocessing draws each process's authkey at its import: every rank and attempt its own.
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        try:
            mp.current_process().authkey = os.urandom(32)
        except Exception:
            pass


def trimmed(tb):
    """The traceback without the server's frames: those below the script (this file and the -c
    line), and the import watcher's between the script's frames (an import that failed). The
    script's own "<string>" frames (exec, eval, dataclasses' generated methods, a -c worker's code)
    stay."""
    for own in reversed(SELF_FILES):  # the -c line, then this file; a -c worker's code follows
        while tb is not None and tb.tb_frame.f_code.co_filename == own:
            tb = tb.tb_next
    link = tb
    while link is not None:
        while link.tb_next is not None and link.tb_next.tb_frame.f_code.co_filename == SELF_FILES[0]:
            link.tb_next = link.tb_next.tb_next
        link = link.tb_next
    return tb


def exit_code_of(e):
    """What the interpreter exits with for an uncaught SystemExit."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


WORKER_MODULES_AFTER = set()  # sys.modules as forked: what was there is the server's


def library_roots():
    """The directories installed code lives in: the standard library and every site-packages."""
    import site
    import sysconfig
    roots = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except Exception:
        pass
    return {os.path.realpath(r) for r in roots if r}


LIBRARY_ROOTS = library_roots()


def is_own_code(mod):
    """A module of the user's own code (the script's directory, the working directory, a source
    tree on PYTHONPATH or an editable install), not an installed library."""
    f = getattr(mod, "__file__", None)
    return isinstance(f, str) and not under(os.path.realpath(f), LIBRARY_ROOTS)


def release_worker_modules():
    """What interpreter shutdown does to the worker's own code, and only to it: the globals of
    __main__, then of the modules of its own it imported (is_own_code), are released, so a file
    opened at module level and never closed is flushed and closed and objects with __del__ run it;
    then the cycles are collected. Library modules are left alone, preloaded or not (gc.freeze
    keeps the collection off the preloaded objects): tearing them down is the copy-on-write storm
    and the slow exit this avoids."""
    own = [m for n, m in list(sys.modules.items())
           if n not in WORKER_MODULES_AFTER and n != "__main__" and is_own_code(m)]
    main = sys.modules.get("__main__")
    if main is not None:
        own.insert(0, main)
    for mod in own:  # __main__ first: its objects use the modules it imported
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        # Newest name first, so an object goes while what it was built from (an imported module,
        # its class) is still there for its __del__; dunder names stay.
        for k in reversed(list(d)):
            if not (k.startswith("__") and k.endswith("__")):
                try:
                    d[k] = None
                except Exception:
                    pass
    gc.collect()


def on_regular_file(f):
    """Whether file object f is open on a regular file (whose close cannot block for ever)."""
    try:
        import stat
        return not f.closed and stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except Exception:
        return False


def close_worker_files(deadline=2.0):
    """What interpreter shutdown does to the files on disk the worker opened and still holds anywhere
    (a library module's global, an object of its own): each is flushed and closed, a gzip trailer
    written; text layers before the buffers under them. Only files on regular files: a pipe or a
    socket may be held by a daemon thread blocked in read() or write() on it, and closing it
    would wait for that thread's lock for ever (the interpreter leaves such an object alone, its
    thread's frame keeps it). On a thread of its own, for at most `deadline` seconds (a file system
    that stopped answering). gc.get_objects() lists only objects made after the fork (the
    preloaded ones are frozen in the permanent generation), so this touches none of the server's
    pages. The standard streams are left to finish()."""
    std = set()
    for s in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__):
        while s is not None and id(s) not in std:
            std.add(id(s))
            try:
                s = getattr(s, "buffer", None) or getattr(s, "raw", None)
            except Exception:
                s = None
    # issubclass of the type: isinstance would read a proxy's __class__, which may raise
    files = [o for o in gc.get_objects() if issubclass(type(o), io.IOBase) and id(o) not in std]
    files = [f for f in files if on_regular_file(f)]
    if not files:
        return

    def close_all():
        for kind in (io.TextIOBase, io.BufferedIOBase):
            for f in files:
                try:
                    if issubclass(type(f), kind) and not f.closed:
                        f.close()
                except Exception:
                    pass
    t = threading.Thread(target=close_all, name="ctrun-warm-exit", daemon=True)
    try:
        t.start()
    except RuntimeError:  # no new thread this late: close here
        close_all()
        return
    t.join(deadline)


def is_closed(f):
    """The interpreter's test at exit: a `closed` that cannot be read counts as open."""
    try:
        return bool(f.closed)
    except Exception:
        return False


def finish(code, kill_with=0):
    """Interpreter shutdown without the teardown: threads, atexit, the worker's own modules
    released, its remaining files closed, stdout/stderr flushed (a closed one is skipped, as the
    interpreter skips it; a failed flush makes exit code 120, as there), then os._exit."""
    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    try:
        release_worker_modules()
    except BaseException:
        pass
    try:
        close_worker_files()
    except BaseException:
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            if f is not None and not is_closed(f):
                f.flush()
        except Exception:
            code = 120 if code == 0 else code
    # The original streams, when the script replaced sys.stdout (`sys.stdout = open(os.devnull,
    # "w")` on ranks but 0): the interpreter flushes them as it destroys them, errors ignored.
    for f in (sys.__stdout__, sys.__stderr__):
        try:
            if f is not None and f is not sys.stdout and f is not sys.stderr and not is_closed(f):
                f.flush()
        except Exception:
            pass
    if kill_with:
        signal.signal(kill_with, signal.SIG_DFL)
        os.kill(os.getpid(), kill_with)
    os._exit(code)


def run_worker(spec):
    import types
    argv = spec["argv"]
    os.chdir(spec["cwd"])
    env = {}
    for kv in spec["env"]:
        k, _, v = kv.partition("=")
        env.setdefault(k, v)
    os.environ.clear()
    os.environ.update(env)
    os.environ.__class__ = RereadingEnviron  # the same object: every reference to it sees the writes
    make_stdio()
    set_cmdline(" ".join(argv))
    rest = argv[1 + spec["nflags"]:]
    sys.orig_argv = list(argv)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    main.__dict__["__annotations__"] = {}  # the interpreter's __main__ has one from the start
    sys.modules["__main__"] = main
    reread_environment(env)
    watch_torch_import()
    outcome = (0, 0)  # exit code, signal to die of
    try:
        if rest[0] == "-m":
            import runpy
            sys.argv = [rest[1]] + rest[2:]
            if SCRIPT_SLOT:
                sys.path.insert(0, os.getcwd())
            runpy._run_module_as_main(rest[1], alter_argv=True)
        elif rest[0] == "-c":  # as `python -c CODE ARGS`: argv[0] "-c", "" first on sys.path, no __file__
            sys.argv = ["-c"] + rest[2:]
            if SCRIPT_SLOT:
                sys.path.insert(0, "")
            from importlib.machinery import BuiltinImporter
            main.__dict__["__loader__"] = BuiltinImporter
            exec(compile(rest[1], "<string>", "exec"), main.__dict__)
        else:
            from importlib.machinery import SourceFileLoader
            path = os.path.abspath(rest[0])
            sys.argv = list(rest)
            if SCRIPT_SLOT:
                sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
            try:
                with open(path, "rb") as f:
                    source = f.read()
            except OSError as e:
                print("%s: can't open file %r: [Errno %d] %s" % (sys.executable, path, e.errno, e.strerror),
                      file=sys.stderr)
                finish(2)
            main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path))
            code = compile(source, path, "exec")
            exec(code, main.__dict__)
    except SystemExit as e:
        outcome = (exit_code_of(e), 0)
    except BaseException as e:
        tb = trimmed(e.__traceback__)
        e.__traceback__ = tb  # the interpreter prints the exception's own traceback
        seen, chained = {id(e)}, [e.__cause__, e.__context__]
        while chained:  # and the tracebacks of the exceptions it chains
            x = chained.pop()
            if x is not None and id(x) not in seen:
                seen.add(id(x))
                x.__traceback__ = trimmed(x.__traceback__)
                chained += [x.__cause__, x.__context__]
        try:
            sys.excepthook(type(e), e, tb)
        except Exception:
            pass
        outcome = (1, signal.SIGINT if isinstance(e, KeyboardInterrupt) else 0)
        del tb
    # Out of the handler: the exception, its traceback and the frames it holds (with their local
    # files and objects) are released before the shutdown, as the interpreter's would be.
    finish(*outcome)


def worker_main(sock):
    """A forked worker: wait for the spec (EOF: ctrun is gone or no longer needs us), then run."""
    os.setpgid(0, 0)
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 22, 4)
    except OSError:
        os._exit(0)
    if not msg:
        os._exit(0)
    spec = json.loads(msg)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != spec["parent"]:
        os._exit(128 + signal.SIGKILL)
    sock.close()
    WORKER_MODULES_AFTER.update(sys.modules)
    # fds 0-2 and the heartbeat channel (when ctrun gives one) at their cold-start numbers; a
    # stdio fd that a cold worker would not have is closed. Parked above the targets first, so
    # no dup2 overwrites an fd still to be placed.
    import fcntl
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(high, spec["fd_targets"]):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)
    for target in spec["closed_fds"]:
        try:
            os.close(target)
        except OSError:
            pass
    run_worker(spec)


# --- the server loop -----------------------------------------------------------------------------
def fork_one(stale_fd):
    """Forks one waiting worker and hands ctrun its pidfd and spec socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    back_r, back_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    pid = os.fork()
    if pid == 0:  # the intermediate
        try:
            ctl.close()
            ours.close()
            back_r.close()
            if stale_fd >= 0:
                os.close(stale_fd)
            wpid = os.fork()
            if wpid == 0:
                back_w.close()
                try:
                    worker_main(theirs)
                except BaseException as e:  # could not become the worker: a failed start, not success
                    print("ctrun --warm: cannot start the worker: %s: %s" % (type(e).__name__, e), file=sys.stderr)
                os._exit(1)
            pidfd = os.pidfd_open(wpid)
            socket.send_fds(back_w, [str(wpid).encode()], [pidfd])
        finally:
            os._exit(0)
    theirs.close()
    back_w.close()
    msg, fds, _, _ = socket.recv_fds(back_r, 64, 1)
    os.waitpid(pid, 0)  # now the worker is ctrun's child
    back_r.close()
    if not msg or not fds:
        ours.close()
        return "cannot fork a worker"
    send({"op": "child", "pid": int(msg)}, [fds[0], ours.fileno()])
    os.close(fds[0])
    ours.close()
    return ""


def serve():
    set_cmdline("ctrun-warm-server " + sys.executable)  # not its source; not the script's name (pkill -f)
    problem = preload()
    stale = Staleness()
    if not problem:
        problem = unsafe_reason()
    gc.collect()
    gc.freeze()  # the children do not dirty the preloaded objects' GC headers
    send({"op": "ready", "pid": os.getpid(), "problem": problem, "files": len(stale.files)})
    while True:
        data = ctl.recv(4096)
        if not data:
            os._exit(0)
        req = json.loads(data)
        if req["op"] == "check":
            send({"op": "check", "stale": stale.check(), "problem": unsafe_reason()})
        elif req["op"] == "fork":
            for _ in range(int(req["n"])):
                problem = unsafe_reason() or fork_one(stale.fd)
                if problem:
                    send({"op": "unsafe", "problem": problem})
                    break


try:
    serve()
except OSError:  # ctrun closed its end (it is done with us, or gone): nothing to report to
    os._exit(0)
