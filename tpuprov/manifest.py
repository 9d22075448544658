"""JobSet manifests from a file, checked at the door so ``tpuprov plan`` answers bad input in words.

The product itself never sees a malformed JobSet: the API server validates every object against
the JobSet CRD's OpenAPI schema before storing it. A manifest on disk has had no such check, so
the fields ``plan`` reads are checked here with the types that schema gives them (jobset.x-k8s.io
v1alpha2: ``replicas``, ``parallelism`` and ``completions`` are integers, ``name`` and ``template``
required in each replicated job, ``nodeSelector`` a string map, ``containers`` required in a pod
spec, resource quantities an integer or a string). Every problem is listed, each with its path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from shared.core.errors import InvalidInputError

Check = Callable[[Any, str, list[str]], object]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return "a list" if isinstance(value, list) else "a mapping"


def _mapping(value: Any, path: str, problems: list[str]) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    problems.append(f"{path} must be a mapping, not {_kind(value)}")
    return {}


def _integer(value: Any, path: str, problems: list[str]) -> None:
    # bool is an int in Python but not in JSON schema.
    if not isinstance(value, int) or isinstance(value, bool):
        problems.append(f"{path} must be an integer, not {_kind(value)}")
    elif value < 0:
        problems.append(f"{path} must not be negative, not {value}")


def _string(value: Any, path: str, problems: list[str]) -> None:
    if not isinstance(value, str):
        problems.append(f"{path} must be a string, not {_kind(value)}")


def _string_map(value: Any, path: str, problems: list[str]) -> None:
    for key, item in _mapping(value, path, problems).items():
        _string(item, f"{path}.{key}", problems)


def _quantities(value: Any, path: str, problems: list[str]) -> None:
    for key, item in _mapping(value, path, problems).items():
        if isinstance(item, bool) or not isinstance(item, int | float | str):
            problems.append(f"{path}.{key} must be a quantity (a number or a string), not {_kind(item)}")


def _list(value: Any, path: str, problems: list[str]) -> list[Any]:
    if isinstance(value, list):
        return value
    problems.append(f"{path} must be a list, not {_kind(value)}")
    return []


def _fields(obj: dict[str, Any], path: str, problems: list[str], checks: dict[str, Check]) -> None:
    for key, check in checks.items():
        if key in obj:
            check(obj[key], f"{path}.{key}", problems)


def _metadata(value: Any, path: str, problems: list[str]) -> None:
    meta = _mapping(value, path, problems)
    _fields(meta, path, problems, {"name": _string, "namespace": _string})
    _fields(meta, path, problems, {"labels": _string_map, "annotations": _string_map})


def _container(value: Any, path: str, problems: list[str]) -> None:
    container = _mapping(value, path, problems)
    if "name" not in container:
        problems.append(f"{path}.name is required")
    resources = _mapping(container.get("resources", {}), f"{path}.resources", problems)
    _fields(resources, f"{path}.resources", problems, {"limits": _quantities, "requests": _quantities})


def _pod_spec(value: Any, path: str, problems: list[str]) -> None:
    spec = _mapping(value, path, problems)
    if "containers" not in spec:
        problems.append(f"{path}.containers is required")
    _fields(spec, path, problems, {"nodeSelector": _string_map})
    _fields(spec, path, problems, {"tolerations": _list, "affinity": _mapping})
    for kind in ("containers", "initContainers"):
        for index, container in enumerate(_list(spec.get(kind, []), f"{path}.{kind}", problems)):
            _container(container, f"{path}.{kind}[{index}]", problems)


def _replicated_job(value: Any, path: str, problems: list[str]) -> None:
    rjob = _mapping(value, path, problems)
    for required in ("name", "template"):
        if required not in rjob:
            problems.append(f"{path}.{required} is required")
    _fields(rjob, path, problems, {"name": _string, "replicas": _integer})
    template = _mapping(rjob.get("template", {}), f"{path}.template", problems)
    job = _mapping(template.get("spec", {}), f"{path}.template.spec", problems)
    _fields(job, f"{path}.template.spec", problems, {"parallelism": _integer, "completions": _integer})
    pod = _mapping(job.get("template", {}), f"{path}.template.spec.template", problems)
    _fields(pod, f"{path}.template.spec.template", problems, {"metadata": _metadata})
    if "spec" in pod:
        _pod_spec(pod["spec"], f"{path}.template.spec.template.spec", problems)


def jobset_problems(doc: dict[str, Any]) -> list[str]:
    """Every reason the API server would refuse this JobSet's shape, as ``path: problem`` strings."""
    problems: list[str] = []
    meta = doc.get("metadata", {})
    _metadata(meta, "metadata", problems)
    if isinstance(meta, dict) and not meta.get("name"):
        problems.append("metadata.name is required")
    if "spec" not in doc:
        problems.append("spec is required")
    spec = _mapping(doc.get("spec", {}), "spec", problems)
    if "suspend" in spec and not isinstance(spec["suspend"], bool):
        problems.append(f"spec.suspend must be true or false, not {_kind(spec['suspend'])}")
    for index, rjob in enumerate(_list(spec.get("replicatedJobs", []), "spec.replicatedJobs", problems)):
        _replicated_job(rjob, f"spec.replicatedJobs[{index}]", problems)
    return problems


def without_nulls(value: Any) -> Any:
    """``value`` with every null-valued field dropped, as the API server stores it: a CRD's
    structural schema prunes a null field that is not ``nullable`` before defaulting and
    validation (Kubernetes "Extend the Kubernetes API with CustomResourceDefinitions", Defaulting
    and Nullable; JobSet's CRD marks none nullable). xpk writes ``annotations:`` with nothing
    under it, which is such a null."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{problem}{where}"


def load_jobsets(text: str, source: str) -> list[dict[str, Any]]:
    """The JobSet documents of a (multi-document) YAML text; other kinds are skipped.

    Raises InvalidInputError naming ``source`` when the text is empty or not YAML, when a document is
    not a Kubernetes object, when it holds no JobSet, or with every problem of each malformed JobSet.
    """
    if not text.strip():
        raise InvalidInputError(f"{source} is empty")
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"{source} is not valid YAML: {_yaml_error(exc)}") from None
    jobsets: list[dict[str, Any]] = []
    problems: list[str] = []
    others: list[str] = []  # what the text holds instead, to say so when it has no JobSet
    for number, doc in enumerate(docs, start=1):
        if doc is None:
            continue  # an empty document between two "---"
        if not isinstance(doc, dict):
            problems.append(f"document {number} is {_kind(doc)}, not a Kubernetes object")
            continue
        if doc.get("kind") != "JobSet":
            others.append(_described(doc))
            continue
        doc = without_nulls(doc)
        found = jobset_problems(doc)
        name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
        what = f"JobSet {name}" if isinstance(name, str) and name else f"the JobSet of document {number}"
        problems.extend(f"{what}: {problem}" for problem in found)
        if not found:
            jobsets.append(doc)
    if problems:
        raise InvalidInputError(f"{source} is not a valid manifest: " + "; ".join(problems))
    if not jobsets:
        if any(o.startswith("Job ") for o in others):
            # The product acts on the pods of JobSets only (their JobSet and Job labels, the
            # JobSet's spec: docs/trust.md), so a bare Job's pods would pend unseen.
            raise InvalidInputError(
                f"no JobSet in {source}: it holds {', '.join(others)}; the product creates pools only "
                "for the pods of a JobSet: put the Job's spec under a JobSet's replicatedJobs "
                "(replicas: 1), or create its node pool yourself"
            )
        raise InvalidInputError(f"no JobSet in {source} (no document has kind: JobSet)")
    return jobsets


def _described(doc: dict[str, Any]) -> str:
    """``Job 'name'`` for a document of another kind (its kind and name, as kubectl names them)."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    kind = doc.get("kind") if isinstance(doc.get("kind"), str) else "an object without a kind"
    return f"{kind} {name!r}" if isinstance(name, str) else str(kind)
