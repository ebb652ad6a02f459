"""machina.startup.allocator: a freed tensor's memory is reused, not faulted in again; the user's variables win.

Each case runs in a fresh interpreter, since malloc's settings are the process's: 20 forward and backward passes of a
small network on [8192, 128] float32 activations (4 MiB each), as a minibatch makes them, counting the minor page
faults (``resource.getrusage``) after 10 passes of warm-up. A page faulted in afresh costs one fault per 4 KiB: 1,024
per activation. With glibc's own settings these passes faulted about 30,000 times, with machina's about 1,200.
"""

import os
import subprocess
import sys

import pytest

from machina.startup.allocator import keep_freed_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

CODE = """
import resource, torch
from torch import nn
from machina.startup.allocator import keep_freed_memory
print(keep_freed_memory())
torch.set_num_threads(2)
net = nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 1))
x = torch.randn(8192, 128)
for i in range(30):
    if i == 10:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    h = x
    for _ in range(4):
        h = torch.sigmoid(h) * h + h
    net(h).sum().backward()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(**variables: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | variables
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    said, count = out.stdout.strip().splitlines()[-2:]
    return said, int(count)


def test_a_freed_tensors_pages_are_reused_not_faulted_in_again():
    said, count = faults()
    assert said == "malloc: freed memory kept for reuse (mmap threshold 32 MiB, no trim)"
    assert count < 5_000, f"{count} page faults in 20 passes: the activations' memory went back to the kernel"


def test_a_malloc_variable_of_the_users_wins_and_nothing_is_set():
    # glibc's threshold fixed at its 128 KiB default by the user: every 4 MiB activation is mmapped and faulted in.
    said, count = faults(MALLOC_MMAP_THRESHOLD_="131072")
    assert said == "malloc: MALLOC_MMAP_THRESHOLD_ from the environment"
    assert count > 15_000


def test_the_message_names_every_variable_the_user_set():
    said = keep_freed_memory({"MALLOC_TOP_PAD_": "1", "MALLOC_TRIM_THRESHOLD_": "2"})
    assert said == "malloc: MALLOC_TRIM_THRESHOLD_ MALLOC_TOP_PAD_ from the environment"
