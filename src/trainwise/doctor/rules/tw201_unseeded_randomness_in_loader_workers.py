"""TW201 unseeded-randomness-in-loader-workers: a seeded script whose DataLoader workers are not reproducible."""

from __future__ import annotations

import ast

from trainwise.doctor.context import dotted, has_star_kwargs, is_const, keyword, last_name
from trainwise.doctor.rule import Rule

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
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


class UnseededRandomnessInLoaderWorkers(Rule):
    """A seeded script whose multi-worker DataLoader draws random numbers that the seed does not control.

    ## What it does
    In a script that asks for reproducibility (`torch.manual_seed`, `random.seed`, `np.random.seed`,
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
