"""The server under load: 32 clients at once for a few seconds, none refused or reset, p99 bounded.

Each client holds one kept-alive connection (as the `openai` client's pool does) and sends small
completions in a loop that stops after `DURATION_S`; the test also opens many idle connections
at once beside them, which a listen backlog of 5 or a thread per connection could not take.
"""

import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest

from lm.server import OpenAIServer, ServerConfig
from tests.lm.generator_helpers import MAX_TOKENS, N, make_tiny_generator

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLIENTS = 32
DURATION_S = 4.0
IDLE_CONNECTIONS = 256
P99_BOUND_S = 10.0  # one request's latency on 2 busy CPU cores: a few batches of the tiny model


def test_32_clients_get_no_connection_errors_and_a_bounded_p99(tmp_path):
  generator = make_tiny_generator(tmp_path)
  config = ServerConfig(model_name="tiny", port=0, max_tokens=16, default_max_tokens=MAX_TOKENS)
  with OpenAIServer(generator, config).start() as server:
    body = json.dumps({"model": "tiny", "prompt": "x + y =", "n": N, "max_tokens": 4, "seed": 0}).encode()
    for size in (1, 2, 4, 8, 16, 32):  # compiles every batch shape before the clock starts
      warm = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
      request = {"model": "tiny", "prompt": ["x + y ="] * size, "n": N, "max_tokens": 4, "seed": 0}
      warm.request("POST", "/v1/completions", body=json.dumps(request).encode())
      assert warm.getresponse().status == 200
      warm.close()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(IDLE_CONNECTIONS)]
    latencies, errors, statuses = [], [], []
    lock, start = threading.Lock(), threading.Barrier(CLIENTS)

    def client(i):
      connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
      start.wait()
      stop_at = time.monotonic() + DURATION_S
      while time.monotonic() < stop_at:
        began = time.monotonic()
        try:
          connection.request(
            "POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"}
          )
          response = connection.getresponse()
          response.read()
          with lock:
            statuses.append(response.status)
            latencies.append(time.monotonic() - began)
        except (OSError, http.client.HTTPException) as e:
          with lock:
            errors.append(f"client {i}: {type(e).__name__}: {e}")
          connection.close()
          connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
      connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=DURATION_S + 120)
    for s in idle:
      s.close()
  assert not errors, errors[:5]
  assert set(statuses) == {200} and len(statuses) >= CLIENTS
  p99 = float(np.percentile(latencies, 99))
  print(f"{len(latencies)} requests from {CLIENTS} clients in {DURATION_S} s; p99 {p99:.2f} s")
  assert p99 < P99_BOUND_S
