import asyncio
import logging

from edgeinspect.services.common.tasks import BackgroundTasks


async def test_a_failed_task_is_logged_with_its_owner_and_dropped(caplog):
    tasks = BackgroundTasks("router")

    async def boom():
        raise RuntimeError("probe broke")

    with caplog.at_level(logging.ERROR, logger="edgeinspect.services.common.tasks"):
        task = tasks.spawn(boom(), name="readmit a:1")
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert len(tasks) == 0
    [record] = caplog.records
    assert "router" in record.getMessage() and "readmit a:1" in record.getMessage()
    assert record.exc_info[1].args == ("probe broke",)


async def test_close_cancels_every_running_task_and_waits_for_its_cleanup():
    tasks = BackgroundTasks("replicas")
    cleaned = []

    async def watch(i):
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)
            cleaned.append(i)

    for i in range(3):
        tasks.spawn(watch(i))
    await asyncio.sleep(0)
    await tasks.close()
    assert sorted(cleaned) == [0, 1, 2] and len(tasks) == 0


async def test_a_cancelled_task_is_not_logged_as_a_failure(caplog):
    tasks = BackgroundTasks("stage")
    task = tasks.spawn(asyncio.sleep(3600))
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="edgeinspect.services.common.tasks"):
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    assert not caplog.records and len(tasks) == 0
