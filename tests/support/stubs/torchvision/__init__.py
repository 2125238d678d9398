"""A stand-in for torchvision in a CPU test environment: vLLM's Qwen3.5 imports its vision code, which imports
torchvision at module level; text-only models never call it. Any attribute is a placeholder that fails if used."""
import sys
import types

__version__ = "0.0.0+stub"


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        return _Placeholder(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"torchvision stub: {self._name} was called")

    def __mro_entries__(self, bases):
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self.__name__}.{item}")


def _install(name):
    mod = sys.modules.get(name)
    if mod is None or not isinstance(mod, _Module):
        mod = _Module(name)
        mod.__path__ = []
        sys.modules[name] = mod
    return mod


for _name in ("torchvision.transforms", "torchvision.transforms.v2", "torchvision.transforms.v2.functional",
              "torchvision.transforms.functional", "torchvision.io", "torchvision.ops", "torchvision.models"):
    _install(_name)
