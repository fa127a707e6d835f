#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests strictly against schemas, offline.

Built-in kinds: the Kubernetes OpenAPI schemas of `kubernetes-validate` (strict: an unknown
field is an error), for every Kubernetes version given. Custom resources (KEDA, prometheus-
operator, CloudNativePG, cert-manager): the JSON Schemas in deploy/k8s/schemas, named
`<kind>-<api group>-<version>.json`. A kind with no schema fails.

    validate.py --kubernetes-version 1.35.0 --kubernetes-version 1.37.0 RENDERED.yaml...
"""

import argparse
import json
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

SCHEMAS = pathlib.Path(__file__).resolve().parent.parent / "schemas"


def crd_schema(api_version, kind):
    """The repository's schema of a custom resource kind, or None for a built-in group."""
    if "/" not in api_version:
        return None
    group, version = api_version.split("/", 1)
    if "." not in group or group.endswith(".k8s.io"):
        return None
    path = SCHEMAS / f"{kind.lower()}-{group}-{version}.json"
    if not path.exists():
        raise LookupError(f"no schema for {kind} ({api_version}): add {path.name} to {SCHEMAS}")
    return json.loads(path.read_text())


def describe(doc):
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{doc.get('kind')}/{(ns + '/') if ns else ''}{meta.get('name')}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", action="append", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    failures = 0
    checked = 0
    for name in args.files:
        with open(name) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            where = f"{name}: {describe(doc)}"
            try:
                schema = crd_schema(doc["apiVersion"], doc["kind"])
            except LookupError as err:
                print(f"FAIL {where}: {err}")
                failures += 1
                continue
            if schema is not None:
                validator = jsonschema.Draft202012Validator(schema)
                errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
                for err in errors:
                    path = "/".join(str(p) for p in err.absolute_path) or "(root)"
                    print(f"FAIL {where} at {path}: {err.message}")
                failures += len(errors)
                checked += 1
                continue
            for version in args.kubernetes_version:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as err:
                    path = "/".join(str(p) for p in err.path) or "(root)"
                    print(f"FAIL {where} (Kubernetes {version}) at {path}: {err.message}")
                    failures += 1
                except kubernetes_validate.SchemaNotFoundError as err:
                    print(f"FAIL {where}: {err.message}")
                    failures += 1
            checked += 1
    if failures:
        print(f"{failures} schema error(s) in {checked} object(s)")
        return 1
    print(f"schemas: {checked} object(s) valid (Kubernetes {', '.join(args.kubernetes_version)}, "
          f"strict; custom resources against {SCHEMAS.name}/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
