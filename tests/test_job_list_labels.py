"""The jobs list's labels (issue 45 item 8): each row's file name, the start of its question and its
batch's name, read for a whole page in one query (never one per row), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from service_helpers import empty_store


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def test_list_labels_reads_a_page_in_one_query(backend, tmp_path):
    from specq.storage import batches, db, documents, jobs

    with empty_store(backend, tmp_path) as url:
        db.upgrade(url)
        with db.session(url) as s:
            batch = batches.create_batch(s, metadata={"name": "nightly"})
            unnamed = batches.create_batch(s, metadata={"owner": "ops"})
            doc_id = documents.put_document(s, tenant="default", text="x = 1\n", filename="stored.py")[0].id
            long_q = "Where is x set, and to what? " * 10
            own = jobs.create_job(s, text="y = 2\n", question="What is y?", filename="own.py", batch_id=batch.id,
                                  custom_id="a").id
            from_doc = jobs.create_job(s, text="", question=long_q, document_id=doc_id, batch_id=unnamed.id,
                                       custom_id="b").id
            bare = jobs.create_job(s, text="z = 3\n").id
            for i in range(40):
                jobs.create_job(s, text=f"v = {i}\n", question=f"q{i}", filename=f"f{i}.py")

            statements: list[str] = []
            engine = db.get_engine(url)
            def listen(conn, cursor, statement, *args):
                if statement.lstrip().upper().startswith("SELECT"):
                    statements.append(statement)

            event.listen(engine, "before_cursor_execute", listen)
            try:
                small = jobs.list_labels(s, [own, from_doc, bare])
                n_small = len(statements)
                page = jobs.list_labels(s, [j.id for j in jobs.list_jobs(s, limit=43)])
            finally:
                event.remove(engine, "before_cursor_execute", listen)
        n_page = len(statements) - n_small - 1  # less list_jobs' own SELECT
        assert n_small == 1 and n_page == 1, statements

        assert small[own] == {"filename": "own.py", "question": "What is y?", "batch_name": "nightly"}
        # the stored document's name; the question's first 120 characters; a batch without a name
        assert small[from_doc] == {"filename": "stored.py", "question": long_q[:119] + "…", "batch_name": None}
        assert small[bare] == {"filename": None, "question": "", "batch_name": None}
        assert len(page) == 43 and page[own]["filename"] == "own.py"
