"""Time and peak memory of estimating models too large to build here.

Each model is estimated in a fresh process (so the peak resident memory is the
estimate's own): a 6.7-billion-parameter decoder written with Keras layers,
and keras_hub's LlamaBackbone of the same size when keras-hub is installed.

    python -m benchmarks.large_models
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASES = {
    "decoder_7b (Keras layers)": """
from benchmarks.zoo import decoder_7b as build
kwargs = {}
""",
    "keras_hub LlamaBackbone 7B": """
import keras_hub
def build():
    return keras_hub.models.LlamaBackbone(vocabulary_size=32000, num_layers=32,
        num_query_heads=32, hidden_dim=4096, intermediate_dim=11008, num_key_value_heads=32)
kwargs = {"input_shape": [(2048,), (2048,)]}
""",
}

RUN = """
import json, time, warnings
warnings.simplefilter("ignore")
import keras_memscope as memscope
from keras_memscope.measure import peak_rss_bytes
t = time.time()
est = memscope.estimate(build, 1, optimizer="adam", device="h200", **kwargs)
print(json.dumps({"params": est.params, "peak_gib": est.peak_bytes / 2**30,
                  "seconds": time.time() - t,
                  "rss_mib": peak_rss_bytes() / 2**20}))
"""


def main() -> int:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.getcwd() + os.pathsep + env.get("PYTHONPATH", "")
    print("| model | parameters | estimated peak (batch 1, Adam) | seconds | peak RSS |")
    print("|---|---|---|---|---|")
    for name, setup in CASES.items():
        proc = subprocess.run([sys.executable, "-c", setup + RUN], capture_output=True,
                              text=True, env=env)
        if proc.returncode != 0:
            print(f"| {name} | skipped: {proc.stderr.strip().splitlines()[-1][:80]} | | | |")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"| {name} | {r['params']:,} | {r['peak_gib']:.1f} GiB | {r['seconds']:.1f} | "
              f"{r['rss_mib']:.0f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
