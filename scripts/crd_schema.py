"""Write the JSON Schema of one version of a CustomResourceDefinition, strict as
kubernetes-validate --strict is for core kinds, for scripts/lint_deploy.sh (check-jsonschema).

    python scripts/crd_schema.py CRD.yaml VERSION OUT.json --source "repo@tag path"

From the CRD's openAPIV3Schema: descriptions dropped (size), `additionalProperties: false` on
every object that lists its properties and does not keep unknown fields, apiVersion and kind
fixed to the CRD's. Not checked by the schema: CEL rules (x-kubernetes-validations) and
defaults; the API server applies those.
"""

import argparse
import json
from pathlib import Path

import yaml


def strict(node):
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items() if key != "description"}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schema(crd: dict, version: str, source: str) -> dict:
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = strict(served["schema"]["openAPIV3Schema"])
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    schema["properties"]["apiVersion"] = {"type": "string", "enum": [f"{group}/{version}"]}
    schema["properties"]["kind"] = {"type": "string", "enum": [kind]}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$comment": f"{kind} {group}/{version} from {source} (scripts/crd_schema.py)",
        **schema,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", type=Path)
    parser.add_argument("version")
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", required=True, help="where the CRD comes from (repo@tag)")
    args = parser.parse_args()
    crd = yaml.safe_load(args.crd.read_text())
    schema = crd_schema(crd, args.version, args.source)
    args.out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
