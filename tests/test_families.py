"""n>1 requests (an n_cmpl family: a parent and its children sharing the prompt's cells): what
/slots shows of the cells they share."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import requests

from helpers import complete

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
