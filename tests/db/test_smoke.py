import pgqueue

PAYLOAD = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_enqueue_smoke(conn):
    job_id = pgqueue.enqueue(conn, tenant_id="acme", origin="user_action", payload=PAYLOAD)
    conn.commit()
    row = conn.execute(
        "SELECT priority::text, state::text FROM pgqueue.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == ("critical", "queued")
