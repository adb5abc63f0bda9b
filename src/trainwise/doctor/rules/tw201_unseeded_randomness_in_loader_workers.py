"""TW201 unseeded-randomness-in-loader-workers: a seeded script whose DataLoader workers are not reproducible."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainwise.doctor.context import (
    Context,
    argument,
    dotted,
    has_star_kwargs,
    is_bound_method,
    is_const,
    is_param,
    keyword,
    last_name,
    walk_own,
)
from trainwise.doctor.context.functions import FunctionValue, callees, constant_of, function_values
from trainwise.doctor.rule import Related, Rule

if TYPE_CHECKING:
    from trainwise.doctor.program import Program

# Seed calls that seed torch's default (CPU) generator: the loader's shuffle order and worker seeds come from it.
_TORCH_SEEDS = frozenset(
    {
        "torch.manual_seed",
        "torch.random.manual_seed",
        "lightning.seed_everything",
        "lightning.pytorch.seed_everything",
        "lightning.fabric.seed_everything",
        "lightning_fabric.seed_everything",
        "pytorch_lightning.seed_everything",
        "lightning.pytorch.utilities.seed.seed_everything",
        "pytorch_lightning.utilities.seed.seed_everything",
        "transformers.set_seed",
        "transformers.trainer_utils.set_seed",
        "accelerate.utils.set_seed",
        "trainwise.seed_everything",
        "trainwise.seeding.seed_everything",
    }
)
# Seed calls that ask for reproducibility without seeding torch's CPU generator.
_OTHER_SEEDS = frozenset(
    {"random.seed", "numpy.random.seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all"}
)
# Calls with "seed" in their name that seed nothing global (or torch's generator at random).
_NOT_SEEDING = frozenset(
    {"default_rng", "RandomState", "SeedSequence", "initial_seed", "seed", "get_seed", "set_seed_fn"}
)
_DETERMINISTIC = frozenset({"torch.use_deterministic_algorithms"})
# RNG objects whose state a worker copies from the dataset: torch reseeds only the global generators per worker.
_RNG_CLASSES = {
    "numpy.random.default_rng": "NumPy Generator",
    "numpy.random.Generator": "NumPy Generator",
    "numpy.random.RandomState": "NumPy RandomState",
    "random.Random": "random.Random",
    "torch.Generator": "torch.Generator",
}
_RANDOM_TORCH = frozenset(
    {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "multinomial",
     "normal"}
)
_DATASET_METHODS = ("__getitem__", "__getitems__", "__iter__")
# Calls that seed a global generator of the process they run in (a worker, in a worker_init_fn): what they seed.
_ALL_THREE = frozenset({"random", "numpy", "torch"})
_GLOBAL_SEEDERS = {
    **{q: _ALL_THREE for q in _TORCH_SEEDS},
    "random.seed": frozenset({"random"}),
    "numpy.random.seed": frozenset({"numpy"}),
    "torch.manual_seed": frozenset({"torch"}),
    "torch.random.manual_seed": frozenset({"torch"}),
    "imgaug.seed": frozenset({"imgaug"}),
    "imgaug.random.seed": frozenset({"imgaug"}),
    "mmcv.runner.set_random_seed": _ALL_THREE,
    "mmengine.runner.set_random_seed": _ALL_THREE,
}
_GENERATOR_NAMES = {"random": "`random`", "numpy": "NumPy's global generator", "torch": "torch's generator",
                    "imgaug": "imgaug's generator"}
# Builtins a seed may go through and stay the same value (int(args.seed), abs(seed) % 2**32).
_SAME_VALUE_CALLS = frozenset({"int", "float", "abs", "round", "min", "max", "str", "getattr"})
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Words in the calls that seed a generator (np.random.seed, manual_seed, set_seed, default_rng(s), Random(s)).
_SEEDING_WORDS = ("seed", "default_rng", "RandomState", "Generator", "Random")


class UnseededRandomnessInLoaderWorkers(Rule):
    """A multi-worker DataLoader whose workers draw random numbers the seed does not control, or all the same ones.

    ## What it does
    Finds a `DataLoader(...)` with worker processes whose `worker_init_fn` seeds a generator with the same value
    in every worker: `np.random.seed(args.seed)`, `random.seed(seed + rank)`, `torch.manual_seed(cfg.SEED)`,
    a seeding helper of the project (`set_seed(args.seed)`), or an RNG object it stores
    (`info.dataset.rng = np.random.default_rng(seed)`), with a seed that reads neither the worker id nor
    anything that differs per worker. The function may be a `def`, a lambda, a method, a
    `functools.partial(f, seed=...)`, a lambda that calls one, or a function imported from another file of the
    run, and the seed may go through a helper of the run (`init_worker(worker_id, rank, seed)` that seeds with
    `rank + seed` ignores the worker id it is given). The finding is on the seed call, in the file that defines
    the function, and names the loader (which may be in another file).

    And, in a script that asks for reproducibility (`torch.manual_seed`, `random.seed`, `np.random.seed`,
    `seed_everything`, `set_seed`, `torch.use_deterministic_algorithms(True)`,
    `torch.backends.cudnn.deterministic = True`), finds a `DataLoader(...)` with a literal `num_workers > 0`
    that either

    - loads a dataset of the file whose `__getitem__` draws from a NumPy `Generator`/`RandomState`, a
      `random.Random` or a `torch.Generator` object that the dataset holds (`self.rng = np.random.default_rng(0)`)
      or that the module holds, with no `worker_init_fn=`; or
    - shuffles (`shuffle=True`) or loads a dataset of the file that draws from `random`, `np.random`,
      `torch.rand*` or `transforms.Random*`, with neither `generator=` nor `worker_init_fn=`, in a script that
      seeds `random` or NumPy (or sets deterministic flags) but never seeds torch.

    ## Why is this bad?
    torch gives every worker its own seed for `random`, NumPy and torch. A `worker_init_fn` that seeds them
    again with one value for all (the process rank is the same in every worker of a process) undoes that: the
    workers draw the same random numbers, so samples loaded by different workers get the same crops, flips and
    noise, and the augmentation is far less random than it looks. Seed from `torch.initial_seed() % 2**32`
    (which differs per worker and per epoch) or add the worker id. The rule stays silent when the seed reads
    the worker id, `torch.initial_seed()`, `get_worker_info()`, a random draw or any call it does not know;
    when the same generator is seeded again with such a value; when the seed runs only in some workers
    (`if worker_id == 0:`); when the function seeds nothing; on `num_workers=0` (or no `num_workers`); and when
    the function cannot be seen (a parameter, a library function, a file outside the run).

    Each worker process starts with a copy of the dataset. torch reseeds the *global* generators of every
    worker (`torch`, `random`, `np.random`) from a base seed drawn from torch's generator, but it cannot reseed
    an RNG object the dataset holds: every worker starts from the same state, so the workers repeat each
    other's random draws (the same crops and noise for different samples), and without persistent workers
    every epoch starts again from the parent's untouched state. And when torch itself is never seeded, the
    shuffle order and the base seed of the workers change on every run, whatever `random.seed` and
    `np.random.seed` were given: the augmentations in the workers are not reproducible.

    The rule stays silent on scripts that never ask for reproducibility, on `num_workers=0` and on worker
    counts that are not literals, on loaders given `**kwargs`, and on datasets that reseed their generator
    per worker (`get_worker_info()`). With `torch.manual_seed` and global random modules only, the run is
    already repeatable for a fixed `num_workers`, and the rule says nothing.

    `trainwise lab seeded-workers` measures it: augmentation in loader workers: unseeded vs seeded_loader.

    ## Example
    ```python
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.manual_seed(0)


    class NoisyDataset(Dataset):
        def __init__(self, data):
            self.data = data
            self.rng = np.random.default_rng(0)

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            return self.data[i] + self.rng.normal(0.0, 0.1, self.data[i].shape)


    loader = DataLoader(NoisyDataset(np.zeros((100, 8))), batch_size=10, num_workers=4)


    def worker_init_fn(worker_id):
        np.random.seed(0)  # the same seed in every worker


    augmented = DataLoader(list(range(100)), batch_size=10, num_workers=4, worker_init_fn=worker_init_fn)
    ```

    ## Use instead
    ```python
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset, get_worker_info

    torch.manual_seed(0)


    class NoisyDataset(Dataset):
        def __init__(self, data):
            self.data = data
            self.rng = np.random.default_rng(0)

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            return self.data[i] + self.rng.normal(0.0, 0.1, self.data[i].shape)


    def reseed(worker_id):
        info = get_worker_info()
        info.dataset.rng = np.random.default_rng(info.seed)


    loader = DataLoader(NoisyDataset(np.zeros((100, 8))), batch_size=10, num_workers=4, worker_init_fn=reseed)
    ```
    A `worker_init_fn` seeds each worker from the seed torch gave it:
    ```python
    import random

    import numpy as np
    import torch
    from torch.utils.data import DataLoader


    def seed_worker(worker_id):
        worker_seed = torch.initial_seed() % 2**32
        np.random.seed(worker_seed)
        random.seed(worker_seed)


    loader = DataLoader(list(range(100)), batch_size=10, num_workers=4, worker_init_fn=seed_worker)
    ```
    For global random modules in a script that does not seed torch, pass
    `generator=torch.Generator().manual_seed(seed), worker_init_fn=trainwise.data.seed_worker`.

    ## Fix safety
    There is no automatic fix: the seed to use and the way to reseed a dataset's own generator depend on the
    script.
    """

    code = "TW201"
    name = "unseeded-randomness-in-loader-workers"
    message = "random draws in DataLoader workers are not controlled by the script's seed"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._seeding: tuple[bool, bool, str] | None = None  # (asks, torch seeded, what is seeded)

    def visit_Call(self, node: ast.Call) -> None:
        """``DataLoader(...)``."""
        if not self.ctx.is_loader_call(node) or has_star_kwargs(node):
            return
        workers = self._workers(node)
        if workers is None:
            return
        asks, torch_seeded, seeded = self._seeds()
        if not asks:
            return
        cls = self._dataset_class(node)
        held = self._held_rng(cls) if cls is not None else None
        if held is not None and keyword(node, "worker_init_fn") is None:
            attr, kind = held
            self.report(
                node,
                f"`{cls.name}` draws from `{attr}`, a {kind}: each of the {workers} workers gets a copy "  # type: ignore[union-attr]
                f"of the same state, so the workers repeat each other's random draws (and, without persistent "
                f"workers, every epoch repeats the first); reseed it per worker in a worker_init_fn "
                f"(e.g. from torch.utils.data.get_worker_info().seed)",
            )
            return
        if torch_seeded or keyword(node, "generator") is not None or keyword(node, "worker_init_fn") is not None:
            return
        shuffle = keyword(node, "shuffle")
        shuffle_value = shuffle.value if shuffle is not None else (node.args[2] if len(node.args) > 2 else None)
        shuffles = shuffle_value is not None and self.ctx.constant(shuffle_value) is True
        random_data = cls is not None and self._draws_randomly(cls)
        if not (shuffles or random_data):
            return
        what = "the shuffle order and the" if shuffles else "the"
        self.report(
            node,
            f"the script seeds {seeded} but never torch: {what} seeds torch gives each of the {workers} workers "
            f"(for random, NumPy and torch) come from torch's unseeded generator and change on every run; pass "
            f"generator=torch.Generator().manual_seed(seed), worker_init_fn=trainwise.data.seed_worker",
        )

    # ------------------------------------------------------------------------------------ worker_init_fn
    def finish(self) -> None:
        """The seed calls of this file's functions that give every worker of a loader the same seed, one finding
        each, at the call: the loaders that run the function may be in any file of the run."""
        program = self.ctx.program
        names = _seeding_definitions(self.ctx)
        if program is None or names is None:
            return
        found: dict[tuple[int, int], list[_AlikeWorkerSeed]] = {}
        for path in (self.ctx.path, *program.importers(self.ctx, names, "worker_init_fn")):
            for alike in program.remember(("TW201 alike worker seeds", path), lambda p=path: _loaders_of(program, p)):
                if alike.file == self.ctx.path:
                    found.setdefault((alike.line, alike.column), []).append(alike)
        if not found:
            return
        calls = {(n.lineno, n.col_offset): n for n in self.ctx.nodes(ast.Call)}  # type: ignore[attr-defined]
        for key, alikes in sorted(found.items()):
            call = calls.get(key)
            if call is None:
                continue
            alikes.sort(key=lambda a: (a.loader.path != self.ctx.path, a.loader.path, a.loader.line))
            first = alikes[0]
            many = f"its {first.workers} workers" if first.workers is not None else "its workers"
            loader = (f"line {first.loader.line}" if first.loader.path == self.ctx.path and first.loader.cell is None
                      else first.loader.where())
            self.report(
                call,
                f"{first.function}, run in each worker of the DataLoader ({loader}), seeds {first.what} with "
                f"`{first.text}`, the same value in every worker ({first.ignores}): {many} draw the same random "
                f"numbers (the same augmentations for different samples), undoing the distinct seed torch gives "
                f"each worker; seed from `torch.initial_seed() % 2**32` (which differs per worker and per epoch) or "
                f"add the worker id",
                related=tuple(dict.fromkeys(a.loader for a in alikes))[:3],
            )

    # ------------------------------------------------------------------------------------------ the loader
    def _workers(self, call: ast.Call) -> int | None:
        kw = keyword(call, "num_workers")
        value = kw.value if kw is not None else (call.args[5] if len(call.args) > 5 else None)
        if value is None:
            return None
        number = self.ctx.constant(value)
        if type(number) is int and number > 0:
            return number
        return None

    def _dataset_class(self, call: ast.Call) -> ast.ClassDef | None:
        kw = keyword(call, "dataset")
        expr = kw.value if kw is not None else (call.args[0] if call.args else None)
        if isinstance(expr, ast.Name):
            reaching = self.ctx.reaching(expr, call)
            if len(reaching) != 1 or reaching[0].kind != "assign" or reaching[0].unpacked:
                return None
            expr = reaching[0].value
        if not isinstance(expr, ast.Call) or not isinstance(expr.func, ast.Name):
            return None
        for b in self.ctx.lookup(expr.func.id, expr):
            if b.kind == "def" and isinstance(b.stmt, ast.ClassDef):
                return b.stmt
        return None

    # ----------------------------------------------------------------------------------------- the dataset
    def _draw_methods(self, cls: ast.ClassDef) -> list[ast.AST]:
        """``__getitem__``/``__iter__`` and the methods of the class they call as ``self.m(...)``."""
        methods = {fn.name: fn for fn in cls.body if isinstance(fn, _FUNCS)}
        found = [methods[n] for n in _DATASET_METHODS if n in methods]
        for fn in list(found):
            for call in self.ctx.calls_within(fn):
                f = call.func
                if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
                        and f.attr in methods and methods[f.attr] not in found):
                    found.append(methods[f.attr])
        return found

    def _held_rng(self, cls: ast.ClassDef) -> tuple[str, str] | None:
        """``(self.rng, kind)`` for an RNG object the dataset (or the module) holds and draws from per item."""
        if any(isinstance(n, (ast.Name, ast.Attribute)) and last_name(n) == "get_worker_info" for n in ast.walk(cls)):
            return None  # reseeds per worker itself
        draws = self._draw_methods(cls)
        if not draws:
            return None
        methods = {fn.name: fn for fn in cls.body if isinstance(fn, _FUNCS)}
        used_attrs: set[str] = set()
        used_names: set[str] = set()
        for fn in draws:
            for n in ast.walk(fn):
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                    used_attrs.add(n.attr)
                elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    used_names.add(n.id)
        init = methods.get("__init__")
        for attr in sorted(used_attrs):
            bindings = [b for b in self.ctx.attr_bindings.get(f"self.{attr}", [])
                        if self.ctx.enclosing_class(b.stmt) is cls]
            if init is None or not bindings or any(self.ctx.scope(b.stmt) is not init for b in bindings):
                continue  # reassigned elsewhere (maybe per worker or per epoch)
            kinds = {self._rng_kind(b.value) for b in bindings}
            if len(kinds) == 1 and None not in kinds and all(not b.unpacked for b in bindings):
                return f"self.{attr}", f"{kinds.pop()} it holds"
        for name in sorted(used_names):
            if any(self.ctx.bindings.get((fn, name)) for fn in draws):
                continue  # a local variable
            found = self.ctx.bindings.get((self.ctx.tree, name), [])
            if len(found) == 1 and found[0].kind == "assign" and not found[0].unpacked:
                kind = self._rng_kind(found[0].value)
                if kind is not None:
                    return name, f"{kind} of the module"
        return None

    def _rng_kind(self, value: ast.AST | None, depth: int = 0) -> str | None:
        if isinstance(value, ast.Name) and depth < 2:  # self.gen = g, with g = torch.Generator() at module level
            found = self.ctx.bindings.get((self.ctx.tree, value.id), [])
            if len(found) == 1 and found[0].kind == "assign" and not found[0].unpacked:
                return self._rng_kind(found[0].value, depth + 1)
            return None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "manual_seed":
            value = value.func.value  # torch.Generator().manual_seed(0)
        if not isinstance(value, ast.Call):
            return None
        return _RNG_CLASSES.get(self.ctx.qualname(value.func) or "")

    def _draws_randomly(self, cls: ast.ClassDef) -> bool:
        for fn in self._draw_methods(cls):
            for call in self.ctx.calls_within(fn):
                q = self.ctx.qualname(call.func) or ""
                root, _, rest = q.partition(".")
                if root == "random" or q.startswith("numpy.random."):
                    return True
                if root == "torch" and rest in _RANDOM_TORCH:
                    return True
                if q.startswith("torchvision.transforms.") and q.rsplit(".", 1)[1].startswith("Random"):
                    return True
        return False

    # -------------------------------------------------------------------------------------------- seeding
    def _seeds(self) -> tuple[bool, bool, str]:
        """Whether the file asks for reproducibility, whether torch may be seeded, and what is seeded."""
        if self._seeding is None:
            asks, torch_seeded, names = False, False, []
            for call in self.ctx.nodes(ast.Call):
                a, t, n = self._classify(call, 0)  # type: ignore[arg-type]
                asks, torch_seeded = asks or a, torch_seeded or t
                if n and n not in names:
                    names.append(n)
            for node in self.ctx.nodes(ast.Assign):
                for target in node.targets:  # type: ignore[attr-defined]
                    if (self.ctx.qualname(target) or "") == "torch.backends.cudnn.deterministic" and is_const(
                        node.value, True  # type: ignore[attr-defined]
                    ):
                        asks = True
                        names.append("cudnn.deterministic")
            seeded = " and ".join(f"`{n}`" for n in names[:2]) or "its RNGs"
            self._seeding = (asks, torch_seeded, seeded)
        return self._seeding

    def _classify(self, call: ast.Call, depth: int) -> tuple[bool, bool, str | None]:
        """(asks for reproducibility, may seed torch's generator, name) for one call."""
        q = self.ctx.qualname(call.func)
        name = q or dotted(call.func) or ""
        short = last_name(call.func) or ""
        if q in _TORCH_SEEDS:
            return True, True, None
        if q in _OTHER_SEEDS:
            return True, False, name.replace("numpy.", "np.")
        if q in _DETERMINISTIC:
            return bool(call.args) and is_const(call.args[0], True), False, "use_deterministic_algorithms"
        if "seed" not in short.lower() or short in _NOT_SEEDING:
            return False, False, None
        if short == "manual_seed":  # a Generator's own seed (torch.cuda.manual_seed is handled above)
            return False, False, None
        if isinstance(call.func, ast.Name) and q is None:
            helpers = [fn for fn in self.ctx.functions_named(short) if self.ctx.enclosing_class(fn) is None]
            if helpers and depth < 2:  # a seeding helper of this file: look inside
                asks = torch_seeded = False
                for fn in helpers:
                    for inner in self.ctx.calls_within(fn):
                        a, t, _ = self._classify(inner, depth + 1)
                        asks, torch_seeded = asks or a, torch_seeded or t
                return asks, torch_seeded, short if asks else None
        return True, True, None  # an unknown seeding helper may seed torch: stay silent on that question


# ------------------------------------------------------------------------------------- worker seeding
@dataclass(frozen=True)
class _AlikeWorkerSeed:
    """A seed call of a worker_init_fn that gives every worker the same seed (its file, line and column), as
    seen from one loader with workers that runs the function (``loader``: its ``worker_init_fn=``). No syntax
    tree: gathered once per run from every file (``Program.gather``)."""

    file: str
    line: int
    column: int
    function: str  # `seed_worker`, `Reseed.__call__`, or "the lambda"
    ignores: str  # "it does not depend on `worker_id`"
    what: str  # what it seeds: "NumPy's global generator"
    text: str  # the seed call's source, shortened
    workers: int | None
    loader: Related


def _seeding_definitions(ctx: Context) -> list[str] | None:
    """The top-level functions and classes of a file that seed something (by the name of the calls they make),
    which a worker_init_fn of another file may be; None when the file seeds nothing at all: no worker_init_fn
    can seed in it (a cheap test before the files that import it are read)."""
    if not any(word in ctx.source for word in _SEEDING_WORDS):
        return None
    names: dict[str, None] = {}
    for call in ctx.nodes(ast.Call):
        name = last_name(call.func) or ""  # type: ignore[attr-defined]
        if any(word in name for word in _SEEDING_WORDS):
            top = [a for a in ctx.ancestors(call) if isinstance(a, (*_FUNCS, ast.ClassDef))]
            if top and ctx.parent(top[-1]) is ctx.tree:
                names[top[-1].name] = None  # type: ignore[union-attr]
    return list(names)


def _loaders_of(program: Program, path: str) -> list[_AlikeWorkerSeed]:
    """``_alike_worker_seeds`` of a file of the run, read if it names ``worker_init_fn``."""
    ctx = program.context(path)
    return _alike_worker_seeds(ctx) if ctx is not None and "worker_init_fn" in ctx.source else []


def _alike_worker_seeds(ctx: Context) -> list[_AlikeWorkerSeed]:
    """For each ``DataLoader(...)`` of a file that may start workers (``num_workers`` a positive or unknown
    value), the first seed call of its ``worker_init_fn`` (in whatever file of the run defines it) that seeds a
    generator alike in every worker."""
    out = []
    for call in ctx.nodes(ast.Call):
        kw = keyword(call, "worker_init_fn")  # type: ignore[arg-type]
        if kw is None or not ctx.is_loader_call(call):  # type: ignore[arg-type]
            continue
        count = keyword(call, "num_workers")  # type: ignore[arg-type]
        value = count.value if count is not None else (call.args[5] if len(call.args) > 5 else None)  # type: ignore[attr-defined]
        if value is None:
            continue  # DataLoader's default: no worker process (or a count hidden in **kwargs)
        workers = constant_of(ctx, value)
        if workers is not ... and not (type(workers) is int and workers > 0):
            continue
        for candidate in function_values(ctx, kw.value, call) or ():
            found = _alike_seed(candidate)
            if found is None:
                continue
            where, seed, what, function, worker = found
            text = where.segment(seed).strip() or "the seed call"
            program = ctx.program
            place = (program.place(ctx, kw.value, "the DataLoader whose workers run it") if program is not None
                     else Related(ctx.path, kw.value.lineno, kw.value.col_offset + 1, "the DataLoader"))
            out.append(_AlikeWorkerSeed(
                where.path, seed.lineno, seed.col_offset, _named(where, function),
                f"it does not depend on `{worker}`" if worker and not worker.startswith("_") else
                "it ignores the worker id", what, text if len(text) <= 60 else text[:57] + "...",
                workers if type(workers) is int else None, place))
            break
    return out


def _named(ctx: Context, fn: ast.AST) -> str:
    """How a message names a function: `seed_worker`, `Reseed.__call__`, or the lambda."""
    name = getattr(fn, "name", None)
    if name is None:
        return "the lambda"
    owner = ctx.parent(fn)
    return f"`{owner.name}.{name}`" if isinstance(owner, ast.ClassDef) else f"`{name}`"


def _alike_seed(fv: FunctionValue) -> tuple[Context, ast.Call, str, ast.AST, str | None] | None:
    """The first call of a worker_init_fn that seeds a generator with a value that is the same in every
    worker (it reads neither the worker id nor anything that differs per worker: ``torch.initial_seed()``,
    ``get_worker_info()``, a random draw, any unknown call), with what it seeds; None when every seed may
    differ, when each generator it seeds alike is also seeded with a value that may, or when it seeds nothing.
    Returned with its file, the function that holds it and that function's worker id parameter: the seed call
    of a helper the worker id is passed to and which ignores it (``lambda wid: init_worker(wid, rank, seed)``),
    else the call in the worker_init_fn."""
    ctx, fn = fv.ctx, fv.function
    worker = fv.parameter(0)
    if worker is None and fn.args.vararg is None:
        return None  # not callable with the worker id: not a worker_init_fn we understand
    body: list[ast.AST] = [fn.body] if isinstance(fn, ast.Lambda) else list(fn.body)
    alike: list[tuple[ast.Call, _Seeded]] = []
    varying: set[str] = set()
    for node in walk_own(body):
        if not isinstance(node, ast.Call):
            continue
        seeded = _seeds(ctx, node)
        if seeded is None:
            continue
        if (seeded.values and all(_same_in_workers(ctx, fn, worker, v) for v in seeded.values)
                and _runs_in_every_worker(ctx, fn, worker, node)):
            alike.append((node, seeded))
        else:
            varying |= seeded.generators
    for node, seeded in sorted(alike, key=lambda a: _position(a[0])):
        if not seeded.generators - varying:
            continue
        if seeded.origin is not None and worker is not None:
            other, helper, inner = seeded.origin
            method = is_bound_method(helper, other.parent(helper))
            for param in (a.arg for a in (*helper.args.posonlyargs, *helper.args.args)):
                passed = argument(helper, param, node, method=method)
                if isinstance(passed, ast.Name) and passed.id == worker:
                    return other, inner, _Seeded(seeded.generators, []).describe(), helper, param
        return ctx, node, seeded.describe(), fn, worker
    return None


@dataclass(frozen=True)
class _Seeded:
    """What one call seeds (``generators``: ``random``, ``numpy``, ``torch``, ``imgaug`` or an RNG attribute),
    the values it seeds them with, as expressions of the calling function, and the helper it goes through."""

    generators: frozenset[str]
    values: list[ast.expr]
    helper: str = ""
    origin: tuple[Context, ast.FunctionDef | ast.AsyncFunctionDef, ast.Call] | None = None  # the helper's seed call

    def describe(self) -> str:
        """``NumPy's global generator``, ```random`, NumPy and torch (through `set_seed`)``."""
        known = [g for g in _GENERATOR_NAMES if g in self.generators]
        if known == ["random", "numpy", "torch"]:
            text = "`random`, NumPy and torch"
        else:
            names = [_GENERATOR_NAMES[g] for g in known] + sorted(self.generators - set(_GENERATOR_NAMES))
            text = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]
        return f"{text} (through `{self.helper}`)" if self.helper else text


def _seeds(ctx: Context, call: ast.Call, depth: int = 0) -> _Seeded | None:
    """What a call seeds and the values it seeds it with: a global generator (``np.random.seed(s)``), an RNG
    object stored on an attribute (``info.dataset.rng = np.random.default_rng(s)``), or a function of the run
    whose body seeds a global generator (``set_seed(s)``, ``init_worker(worker_id, rank, seed)``): then the
    values are the arguments the call gives the parameters those seeds read (a constant when they read none)."""
    q = ctx.qualname(call.func)
    values = [a for a in call.args[:1] if not isinstance(a, ast.Starred)]
    values += [kw.value for kw in call.keywords if kw.arg in ("seed", "a")]
    if q in _GLOBAL_SEEDERS:
        return _Seeded(_GLOBAL_SEEDERS[q], values)
    if q in _RNG_CLASSES:
        parent = ctx.parent(call)
        if (isinstance(parent, ast.Assign) and len(parent.targets) == 1
                and isinstance(parent.targets[0], ast.Attribute) and call.args):
            return _Seeded(frozenset({f"`{dotted(parent.targets[0]) or 'an RNG'}` (a {_RNG_CLASSES[q]})"}), values)
        return None
    name = last_name(call.func) or ""
    if q is not None and ctx.program is not None and ctx.program.resolve(ctx, call.func) is None:
        return None  # a library function: only the known ones above count
    if depth > 1 or name in _NOT_SEEDING:
        return None
    for other, fn in callees(ctx, call):
        generators: set[str] = set()
        read: set[str] = set()
        first: ast.Call | None = None
        for inner in sorted((n for n in walk_own(fn.body) if isinstance(n, ast.Call)), key=_position):
            seeded = _seeds(other, inner, depth + 1)
            if seeded is None or not seeded.values:
                continue
            inputs = [_inputs(other, fn, v) for v in seeded.values] + [_guard_inputs(other, fn, inner)]
            if all(i is not None for i in inputs):
                generators |= seeded.generators
                read.update(*inputs)  # type: ignore[misc]
                first = first or inner
        if generators and first is not None:
            return _Seeded(frozenset(generators), _passed(other, fn, call, read), name, (other, fn, first))
    return None


def _passed(callee: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call,
            read: set[str]) -> list[ast.expr]:
    """The arguments ``call`` gives the parameters ``read`` of ``fn`` (defaults need none: they are the same
    everywhere); the call itself, which no check takes for a constant, when one cannot be told (``*args``)."""
    method = is_bound_method(fn, callee.parent(fn))
    out: list[ast.expr] = []
    for name in sorted(read):
        passed = argument(fn, name, call, method=method) if is_param(fn, name) else None
        if passed is None:
            if not is_param(fn, name) or argument(fn, name, call, method=method, default=True) is None:
                return [call]
            continue
        out.append(passed)
    return out or [ast.Constant(0)]


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _same_in_workers(ctx: Context, fn: ast.AST, worker: str | None, expr: ast.AST) -> bool:
    """Whether ``expr`` (in ``fn``) has the same value in every worker: it reads neither the worker id
    parameter nor ``*args`` (see ``_inputs``)."""
    inputs = _inputs(ctx, fn, expr)
    args = getattr(fn, "args", None)
    star = {a.arg for a in (getattr(args, "vararg", None), getattr(args, "kwarg", None)) if a is not None}
    return inputs is not None and worker not in inputs and not inputs & star


def _inputs(ctx: Context, fn: ast.AST, expr: ast.AST, seen: frozenset[str] = frozenset()) -> set[str] | None:
    """The parameters of ``fn`` that ``expr`` (in ``fn``) reads, directly or through local variables, when
    everything else it reads is the same in every worker: constants, names of the enclosing scopes
    (``args.seed``, a rank), arithmetic and ``int()``-like builtins; None when it reads something that may
    differ per worker by itself: any other call (``torch.initial_seed()``, ``get_worker_info()``, a draw)."""
    args = getattr(fn, "args", None)
    star = {a.arg for a in (getattr(args, "vararg", None), getattr(args, "kwarg", None)) if a is not None}
    read: set[str] = set()
    for n in ast.walk(expr):
        if isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.NamedExpr,
                          ast.Await, ast.Yield, ast.YieldFrom)):
            return None
        if isinstance(n, ast.Call):
            func = n.func
            if isinstance(func, ast.Name) and func.id in _SAME_VALUE_CALLS and not ctx.lookup(func.id, n):
                continue
            if isinstance(func, ast.Attribute) and func.attr == "get" and not n.keywords:
                continue  # cfg.get("seed", 0)
            return None
        if not isinstance(n, ast.Name) or not isinstance(n.ctx, ast.Load) or n.id in seen:
            continue
        if n.id in star or is_param(fn, n.id):
            read.add(n.id)
        for b in ctx.bindings.get((fn, n.id), ()):
            if b.kind == "param":
                continue
            if b.kind not in ("assign", "augassign") or b.unpacked or b.value is None:
                return None
            inner = _inputs(ctx, fn, b.value, seen | {n.id})
            if inner is None:
                return None
            read |= inner
    return read


def _runs_in_every_worker(ctx: Context, fn: ast.AST, worker: str | None, node: ast.AST) -> bool:
    """Whether nothing that may differ per worker decides if ``node`` runs (``if worker_id == 0:``)."""
    guard = _guard_inputs(ctx, fn, node)
    args = getattr(fn, "args", None)
    star = {a.arg for a in (getattr(args, "vararg", None), getattr(args, "kwarg", None)) if a is not None}
    return guard is not None and worker not in guard and not guard & star


def _guard_inputs(ctx: Context, fn: ast.AST, node: ast.AST) -> set[str] | None:
    """The parameters of ``fn`` read by the tests that decide whether ``node`` runs; None when a test may
    differ per worker by itself, or when ``node`` is in a loop."""
    read: set[str] = set()
    for up in ctx.ancestors(node):
        if up is fn:
            return read
        if isinstance(up, (ast.If, ast.IfExp, ast.While)):
            inputs = _inputs(ctx, fn, up.test)
            if inputs is None:
                return None
            read |= inputs
        if isinstance(up, (ast.For, ast.AsyncFor)):
            return None
    return read
