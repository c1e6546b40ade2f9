"""Beam conventions shared by beamsynth's PTransforms: element types and display data.

**Element types.** :func:`element_types` is a class decorator for a composite PTransform:

* it declares Beam's type hints (``with_input_types`` / ``with_output_types``), so a PCollection
  our transforms produce carries its element type and the next transform checks it;
* a PCollection whose element type is known and does not match fails **when the pipeline is
  built**, with a message naming the transform, the expected and the actual element type, and
  the public API for dicts / ``beam.Row`` s (:data:`API_HINT`), instead of Beam's generic
  "Input type hint violation";
* a PCollection of unknown element type (``Any``: e.g. ``beam.Map(json.loads)``) cannot be
  judged when the pipeline is built, so the transform's first step checks each element and fails
  the run at the first element of the wrong type with the same message (it used to fail deep in a
  DoFn with ``'dict' object has no attribute 'codes'``). That step costs one ``isinstance`` per
  element; inputs of a known, matching type get no extra step;
* named outputs (a dict of PCollections, e.g. ``{"batches": ..., "rejected": ...}``) get their
  declared element types.

**Display data.** :func:`display_items` builds ``DisplayDataItem`` s for ``display_data()``:
mechanism, ε, δ, noise scale, domain sizes and other public parameters, never data values or
the run secret. Integers beyond 64 bits (declared domains of 10^30 cells) are shown as text.

Beam-free helpers (:func:`describe_type`, :func:`conforms`) do the arithmetic; the decorator only
wires them into Beam.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam import typehints as beam_typehints
from apache_beam.options.pipeline_options import TypeOptions
from apache_beam.transforms.display import DisplayDataItem
from apache_beam.transforms.ptransform import get_named_nested_pvalues
from apache_beam.transforms.window import TimestampedValue
from apache_beam.typehints import native_type_compatibility, typehints
from apache_beam.utils.windowed_value import WindowedValue

__all__ = [
    "API_HINT",
    "ElementTypeError",
    "NotAPCollectionError",
    "conforms",
    "describe_type",
    "display_items",
    "element_type_error",
    "element_types",
    "keywords_checked",
    "typed_boundary",
]

# Where a user with dicts / beam.Rows / Arrow batches should go (the public API, api/__init__.py).
API_HINT = ("to apply beamsynth to dicts, beam.Rows, Arrow batches or a DataFrame, encode them "
            "first with the public API: records | bs.PrivacyJob(...).private(schema) or "
            "bs.MakePrivate(...) (import beamsynth as bs)")

_INT64_MAX = 2**63 - 1


class ElementTypeError(TypeError):
    """A PCollection whose elements are not what a beamsynth transform takes."""


class NotAPCollectionError(TypeError, AttributeError):
    """A beamsynth output that is no PCollection (the private collection, a dict of tables) where
    Beam asks for a PCollection's ``element_type`` or ``windowing`` (``to_dataframe``, side
    inputs). Also an ``AttributeError``, so ``hasattr(x, "element_type")`` stays ``False``."""


def describe_type(hint: Any) -> str:
    """A short, readable name of a type or Beam type hint (``dict``, ``Dict[str, int]``)."""
    if isinstance(hint, type):
        return hint.__name__
    text = str(hint)
    # Beam prints classes inside composite hints as "<class 'module.Name'>"
    while "<class '" in text:
        start = text.index("<class '")
        end = text.index("'>", start)
        text = text[:start] + text[start + 8:end].rsplit(".", 1)[-1] + text[end + 2:]
    return text


def element_type_error(transform: str, expected: Any, got: str, *, where: str = "") -> ElementTypeError:
    """The error for a PCollection of the wrong element type (same text at build and run time)."""
    at = f" (input {where!r})" if where else ""
    return ElementTypeError(f"{transform} takes {describe_type(expected)} elements{at}; got {got} "
                            f"— {API_HINT}")


def _beam_type(hint: Any) -> Any:
    return native_type_compatibility.convert_to_beam_type(hint)


def _unknown(element_type: Any) -> bool:
    # Create([TimestampedValue(x, t)]) is typed TimestampedValue, but its elements arrive as x
    return (element_type is None or element_type == typehints.Any
            or element_type in (TimestampedValue, WindowedValue))


def conforms(value: Any, hint: Any) -> bool:
    """Whether one element matches a declared element type (classes, ``Tuple[...]``, ``Any``;
    numpy integers count as ``int``)."""
    hint = _beam_type(hint)
    if hint == typehints.Any:
        return True
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    if isinstance(hint, typehints.TupleHint.TupleConstraint):
        return (isinstance(value, tuple) and len(value) == len(hint.tuple_types)
                and all(conforms(v, h) for v, h in zip(value, hint.tuple_types)))
    if isinstance(hint, typehints.TupleHint.TupleSequenceConstraint):
        return isinstance(value, tuple) and all(conforms(v, hint.inner_type) for v in value)
    if isinstance(hint, typehints.UnionHint.UnionConstraint):
        return any(conforms(value, h) for h in hint.union_types)
    try:
        typehints.check_constraint(hint, value)
    except (beam_typehints.TypeCheckError, typehints.CompositeTypeHintError,
            typehints.SimpleTypeHintError, TypeError):
        return False
    return True


class _CheckElementsFn(beam.DoFn):
    """Pass elements through; raise :class:`ElementTypeError` at the first one of a wrong type."""

    def __init__(self, transform: str, expected: Any, where: str) -> None:
        self._transform, self._expected, self._where = transform, expected, where

    def process(self, element: Any):
        if not conforms(element, self._expected):
            raise element_type_error(self._transform, self._expected, type(element).__name__,
                                     where=self._where)
        yield element


def _inputs_of(pvalueish: Any, inputs: Mapping[str, Any] | Any) -> list[tuple[str, Any, Any]]:
    """``(name, PCollection, expected type)`` of every declared input found in ``pvalueish``."""
    if isinstance(inputs, Mapping):
        out = []
        for key, hint in inputs.items():
            if isinstance(pvalueish, Mapping) and isinstance(pvalueish.get(key), beam.PCollection):
                out.append((str(key), pvalueish[key], hint))
            elif isinstance(pvalueish, (tuple, list)) and isinstance(key, int) and key < len(pvalueish):
                if isinstance(pvalueish[key], beam.PCollection):
                    out.append((str(key), pvalueish[key], hint))
        return out
    if isinstance(pvalueish, beam.PCollection):
        return [("", pvalueish, inputs)]
    if isinstance(pvalueish, (tuple, list)):  # several PCollections of the one declared type
        return [(str(i), pc, inputs) for i, pc in enumerate(pvalueish)
                if isinstance(pc, beam.PCollection)]
    return []


def _replace_input(pvalueish: Any, name: str, pcoll: beam.PCollection) -> Any:
    if name == "":
        return pcoll
    if isinstance(pvalueish, Mapping):
        return {**pvalueish, name: pcoll}
    items = list(pvalueish)
    items[int(name)] = pcoll
    return type(pvalueish)(items) if isinstance(pvalueish, tuple) else items


def _set_output_types(transform: str, result: Any, outputs: Mapping[str, Any]) -> None:
    for key, hint in outputs.items():
        value = result.get(key) if isinstance(result, Mapping) else None
        pcolls = value if isinstance(value, (list, tuple)) else [value]
        for pcoll in pcolls:
            if not isinstance(pcoll, beam.PCollection):
                continue
            if _unknown(pcoll.element_type):
                pcoll.element_type = _beam_type(hint)
            elif not typehints.is_consistent_with(pcoll.element_type, _beam_type(hint)):
                raise ElementTypeError(f"{transform} output {key!r} has element type "
                                       f"{describe_type(pcoll.element_type)}, declared "
                                       f"{describe_type(hint)} (a bug in {transform})")


def element_types(input: Any = None, output: Any = None, *,
                  inputs: Mapping[Any, Any] | None = None,
                  outputs: Mapping[str, Any] | None = None) -> Callable[[type], type]:
    """Class decorator declaring a composite PTransform's element types (see the module doc).

    Args:
      input: element type of a single input PCollection (None: the input is a pipeline root or
        not checked).
      output: element type of a single output PCollection (Beam's ``with_output_types``).
      inputs: for dict or tuple inputs, name or position → element type.
      outputs: for dict outputs, name → element type (a list of PCollections under one name gets
        the type on each).
    """
    if input is not None and inputs is not None:
        raise ValueError("give input (one PCollection) or inputs (named), not both")
    if output is not None and outputs is not None:
        raise ValueError("give output (one PCollection) or outputs (named), not both")
    declared_inputs = inputs if inputs is not None else input

    def decorate(cls: type) -> type:
        if input is not None:
            cls = beam.typehints.with_input_types(input)(cls)
        if output is not None:
            cls = beam.typehints.with_output_types(output)(cls)
        original_expand = cls.expand

        def type_check_inputs(self: beam.PTransform, pvalueish: Any) -> None:
            if declared_inputs is None:
                return
            name = type(self).__name__
            for where, pcoll, hint in _inputs_of(pvalueish, declared_inputs):
                actual = pcoll.element_type
                if not _unknown(actual) and not typehints.is_consistent_with(actual, _beam_type(hint)):
                    raise element_type_error(name, hint, describe_type(actual), where=where)

        @functools.wraps(original_expand)
        def expand(self: beam.PTransform, pvalueish: Any) -> Any:
            name = type(self).__name__
            if declared_inputs is not None:
                for where, pcoll, hint in _inputs_of(pvalueish, declared_inputs):
                    if _unknown(pcoll.element_type):  # judge each element at run time
                        step = "CheckElements" + (f"[{where}]" if where else "")
                        checked = pcoll | step >> beam.ParDo(_CheckElementsFn(name, hint, where))
                        checked.element_type = _beam_type(hint)
                        pvalueish = _replace_input(pvalueish, where, checked)
            result = original_expand(self, pvalueish)
            if outputs is not None:
                _set_output_types(name, result, outputs)
            return result

        cls.type_check_inputs = type_check_inputs
        cls.expand = expand
        cls.declared_element_types = {"input": declared_inputs, "output": output if outputs is None
                                      else dict(outputs)}
        return cls

    return decorate


@contextlib.contextmanager
def _inner_steps_default_to_any(pipeline: Any):
    """Inside: Beam's ``--type_check_strictness=ALL_REQUIRED`` reads as ``DEFAULT_TO_ANY``."""
    options = getattr(pipeline, "_options", None)
    types = options.view_as(TypeOptions) if options is not None else None  # shares the values
    if types is None or types.type_check_strictness != "ALL_REQUIRED":
        yield
        return
    types.type_check_strictness = "DEFAULT_TO_ANY"
    try:
        yield
    finally:
        types.type_check_strictness = "ALL_REQUIRED"


def typed_boundary(expand: Callable[..., Any]) -> Callable[..., Any]:
    """``expand`` of a public composite whose own input and output types are declared: its inner
    steps are checked as usual but need no output type of their own under Beam's
    ``--type_check_strictness=ALL_REQUIRED`` (the composite's declared types are the contract;
    a job built with that flag failed at the first of about 100 inner steps,
    ``no output type-hint was found for the PTransform _MultiParDo(MakePrivate(adult)/Encode/
    Encode)``, naming no public step). Beam checks the composite itself on return; a composite
    with several outputs (``Marginals``' tables, ``job.private``'s batches and dead letters)
    declares the union of their element types."""
    if getattr(expand, "_typed_boundary", False):
        return expand

    @functools.wraps(expand)
    def wrapped(self: beam.PTransform, pvalueish: Any) -> Any:
        with _inner_steps_default_to_any(getattr(self, "pipeline", None) or _pipeline_of(pvalueish)):
            result = expand(self, pvalueish)
        if self.get_type_hints().output_types is None:  # dict/tuple outputs: each one's own type
            found = [pc.element_type for _, pc in get_named_nested_pvalues(result)
                     if isinstance(pc, beam.PCollection) and not _unknown(pc.element_type)]
            if found:
                self.with_output_types(typehints.Union[tuple(found)] if len(found) > 1 else found[0])
        return result

    wrapped._typed_boundary = True  # type: ignore[attr-defined]
    return wrapped


def _pipeline_of(pvalueish: Any) -> Any:
    if isinstance(pvalueish, beam.Pipeline):
        return pvalueish
    found = getattr(pvalueish, "pipeline", None)
    if found is not None:
        return found
    for value in (pvalueish.values() if isinstance(pvalueish, Mapping) else
                  pvalueish if isinstance(pvalueish, (tuple, list)) else ()):
        if getattr(value, "pipeline", None) is not None:
            return value.pipeline
    return None


def display_items(**values: Any) -> dict[str, DisplayDataItem]:
    """``display_data()`` items from public parameters: labels from the keys; ``None`` → ``"none"``;
    integers beyond 64 bits and other non-scalars → text."""
    out = {}
    for key, value in values.items():
        if value is None:
            value = "none"
        elif isinstance(value, bool) or isinstance(value, str):
            pass
        elif isinstance(value, (int, np.integer)):
            value = int(value) if abs(int(value)) <= _INT64_MAX else str(int(value))
        elif isinstance(value, (float, np.floating)):
            value = float(value)
        else:
            value = str(value)
        out[key] = DisplayDataItem(value, label=key.replace("_", " "))
    return out


def keywords_checked(init: Any) -> Any:
    """``init`` with Python's bare keyword errors replaced by the ``bs.`` name, the nearest
    parameter and the list (``bs.PrivBayes(row=100)`` said ``Synthesize.__init__() got an
    unexpected keyword argument 'row'``, naming the parent class). Positional values are echoed
    as the keyword call they would be (``bs.DeclaredWindows(0, 3600, 600)`` → ``call
    bs.DeclaredWindows(start=0, end=3600, size=600)``)."""
    params = [p for name, p in inspect.signature(init).parameters.items() if name != "self"]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return init
    names = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p.name for p in params if p.default is p.empty
                and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in names]
        missing = [n for n in required if n not in kwargs and n not in names[:len(args)]]
        if missing and not unknown and len(args) <= positional:  # bs.Count(): Python's
            # 'Count.__init__() missing 1 required keyword-only argument', without the bs. name
            shown = [n for n in names if n in inspect.signature(type(self)).parameters]
            raise TypeError(f"bs.{type(self).__name__} needs {' and '.join(n + '=' for n in missing)} "
                            f"(no default{'s' * (len(missing) > 1)}); it takes: {', '.join(shown)}")
        if unknown or (len(args) > positional and not variadic):  # the error path only
            name = f"bs.{type(self).__name__}"
            shown = [n for n in names if n in inspect.signature(type(self)).parameters]  # named forms
            if not unknown:
                free = [n for n in shown if n not in kwargs]
                call = ""
                if len(args) <= len(free):  # the keyword call those values would be
                    given = [f"{n}={v!r}" for n, v in zip(free, args)]
                    given += [f"{k}={v!r}" for k, v in kwargs.items()]
                    call = f"; call {name}({', '.join(given)})"
                raise TypeError(f"{name} takes keyword arguments only ("
                                f"{', '.join(n + '=' for n in shown)}); got {len(args)} positional: "
                                f"{', '.join(map(repr, args))}{call}")
            close = difflib.get_close_matches(unknown[0], shown, n=1, cutoff=0.6)
            raise TypeError(f"{name} got an unknown keyword {unknown[0]!r}"
                            + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; it takes: {', '.join(shown)}")
        init(self, *args, **kwargs)

    checked._keywords_checked = True  # type: ignore[attr-defined]
    return checked
