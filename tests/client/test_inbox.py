"""The consumer's inbox (client/inbox.py): items in order, a waiting worker woken per
new item, and no item left waiting for a worker that was cancelled."""

from __future__ import annotations

import asyncio

from lockmq.client.inbox import Inbox


def test_items_come_out_in_order_and_clear_counts_what_it_drops() -> None:
    async def main() -> None:
        inbox: Inbox[int] = Inbox()
        inbox.put_many([1, 2, 3])
        assert len(inbox) == 3
        assert [await inbox.get(), inbox.items.popleft()] == [1, 2]
        assert inbox.clear() == 1 and len(inbox) == 0
    asyncio.run(main())


def test_each_new_item_wakes_one_waiting_worker_in_turn() -> None:
    async def main() -> None:
        inbox: Inbox[str] = Inbox()
        got: list[tuple[int, str]] = []

        async def worker(k: int) -> None:
            got.append((k, await inbox.get()))
        tasks = [asyncio.create_task(worker(k)) for k in range(3)]
        await asyncio.sleep(0)   # (all three wait)
        inbox.put_many(["a", "b"])
        await asyncio.sleep(0)
        assert sorted(got) == [(0, "a"), (1, "b")]   # the two longest waiting, no more
        inbox.put_many(["c"])
        await asyncio.gather(*tasks)
        assert sorted(got) == [(0, "a"), (1, "b"), (2, "c")]
    asyncio.run(main())


def test_a_worker_cancelled_after_its_wake_up_passes_it_on() -> None:
    async def main() -> None:
        inbox: Inbox[str] = Inbox()
        first = asyncio.create_task(inbox.get())
        second = asyncio.create_task(inbox.get())
        await asyncio.sleep(0)
        inbox.put_many(["x"])   # wakes the first ...
        first.cancel()          # ... which is cancelled before it runs
        assert await asyncio.wait_for(second, 1) == "x"
        assert first.cancelled()
    asyncio.run(main())


def test_a_cancelled_waiter_is_not_woken_later() -> None:
    async def main() -> None:
        inbox: Inbox[str] = Inbox()
        gone = asyncio.create_task(inbox.get())
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        waiting = asyncio.create_task(inbox.get())
        await asyncio.sleep(0)
        inbox.put_many(["y"])
        assert await asyncio.wait_for(waiting, 1) == "y"
    asyncio.run(main())
