"""Merge the Prometheus text of several backends into one valid exposition.

Concatenating them would repeat `# HELP`/`# TYPE` for the same family, which
Prometheus rejects; instead each sample gets a `replica` label and each family
is written once.
"""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"


def merge_exposition(texts: dict[str, str]) -> str:
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in texts.items():
        for family in text_string_to_metric_families(text):
            doc, kind, lines = families.setdefault(family.name, (family.documentation, family.type, []))
            for sample in family.samples:
                labels = {"replica": replica, **sample.labels}
                label_text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                lines.append(f"{sample.name}{{{label_text}}} {_format_value(sample.value)}")
    out: list[str] = []
    for name, (doc, kind, lines) in families.items():
        out.append(f"# HELP {name} {doc}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
    return "\n".join(out) + "\n" if out else ""
