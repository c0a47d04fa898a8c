"""n>1 requests (an n_cmpl family: a parent and its children sharing the prompt's cells) in a pool
that fills: once the prompt is in every choice's cells, a choice is parked like any other slot and
resumed, so the family completes instead of ending with "Context size has been exceeded"; and what
/slots shows of the cells they share."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import requests

from helpers import complete, run_concurrently

N_FAMILY = 200


def _family(srv: Any, i: int) -> requests.Response:
    prompt = f"The little dog {i} ran to the park"
    if i % 2 == 0:
        return complete(srv, prompt, N_FAMILY, n_cmpl=3)
    return srv.post("/v1/completions", {"prompt": prompt, "max_tokens": N_FAMILY, "n": 3, "temperature": 0,
                                        "ignore_eos": True})


def test_n_cmpl_families_are_parked_and_complete_exactly_in_a_full_pool(start_server: Any, stories_model: Path) -> None:
    srv = start_server(stories_model, n_ctx=1024, n_parallel=6, preempt_mode="swap")
    reference = {i: complete(srv, f"The little dog {i} ran to the park", N_FAMILY).json()["content"] for i in range(4)}
    plain = [lambda i=i: complete(srv, f"Once upon a time {i}", 200 + 40 * i) for i in range(6)]
    families = [lambda i=i: _family(srv, i) for i in range(4)]
    results = run_concurrently([*plain, *families])
    for r in results:
        assert r.status_code == 200, r.text
    for i, r in enumerate(results[6:]):
        body = r.json()
        texts = [c["content"] for c in body] if i % 2 == 0 else [c["text"] for c in body["choices"]]
        assert texts == [reference[i]] * 3, i  # every choice whole and exact (greedy: the solo answer)
    m = srv.metrics()
    assert m["n_preempt_total"] > 0  # the pool did fill: something was parked
    assert m["n_preempt_fail_total"] == 0
    assert "Context size has been exceeded" not in srv.log_text()

def test_slots_show_the_cells_a_family_shares(start_server: Any, stories_model: Path) -> None:
    """/slots' n_cells and n_cells_shared (llama_memory_seq_n_cells(), patch 0020): the two choices of
    an n_cmpl request each hold the prompt's cells shared and their answers' own; a request of its
    own beside them shares none. A park frees n_cells - n_cells_shared."""
    import threading

    from helpers import n_tokens, wait_until

    srv = start_server(stories_model, n_ctx=4096, n_parallel=3)  # 3 x (prompt + 1000) < 4096: nothing is parked
    prompt = "Once upon a time there was a little girl named Lily"
    n_prompt = n_tokens(srv, prompt)
    out: dict[str, requests.Response] = {}
    threads = [threading.Thread(target=lambda: out.setdefault("family", complete(srv, prompt, 1000, n_cmpl=2)), daemon=True),
               threading.Thread(target=lambda: out.setdefault("alone", complete(srv, "The dog ran to the park", 1000)),
                                daemon=True)]
    for t in threads:
        t.start()

    def all_three() -> list[dict[str, Any]] | None:
        rows = [s for s in srv.slots() if s["is_processing"] and s["n_cells"] > n_prompt + 8]
        return rows if len(rows) == 3 else None

    rows = wait_until(all_three, 60, "the two choices and the other request generating past their prompts")
    shared = sorted(s["n_cells_shared"] for s in rows)
    assert shared[0] == 0, rows  # the request of its own
    assert shared[1] == shared[2] and shared[1] in (n_prompt - 1, n_prompt), rows  # the family's prompt cells
    assert all(s["n_cells"] > s["n_cells_shared"] for s in rows)  # and each answer's own
    for t in threads:
        t.join(120)
    assert out["family"].status_code == 200, out["family"].text
    assert out["alone"].status_code == 200, out["alone"].text
