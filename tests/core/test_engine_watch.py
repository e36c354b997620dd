"""Engine health during training against SGLang's /health (a labelled TEST DOUBLE of SGLang).

SGLang answers /health by generating one token: while a weight sync has generation paused
it waits, then answers 503. The watchdog must not call such an engine dead (it restarted
healthy engines during every long sync), yet must still find an engine that really died.
"""

from __future__ import annotations

import sys

import anyio
import pytest
from sglang_double import install_shim

from agentrl_core.config import EngineConfig, SGLangOptions, config_from_dict
from agentrl_core.rollout.engine_client import EnginePool
from agentrl_core.rollout.sglang_driver import SGLangDriver
from agentrl_core.train.engine_watch import EngineWatchdog

pytestmark = [pytest.mark.anyio, pytest.mark.processes]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def sglang_engine(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("PYTHONPATH", str(install_shim(tmp_path / "shim")))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "1")  # SGLang's 20 s, shortened
    driver = SGLangDriver(EngineConfig(driver="sglang", sglang=SGLangOptions(python=sys.executable)),
                          log_dir=str(tmp_path / "logs"))
    with driver:
        [url] = driver.launch("current", str(tiny_model_dir), [[0]])
        yield driver, url


async def test_a_paused_sglang_engine_is_not_restarted_but_a_dead_one_is(sglang_engine):
    driver, url = sglang_engine
    restarted = []

    async def restart(pool, engine):
        restarted.append(engine)
        return engine

    async with EnginePool("current", [url], health_timeout=10) as pool:
        watchdog = EngineWatchdog({"current": pool}, restart=restart, interval=0.01, unhealthy_checks=1,
                                  max_restarts=5)
        await pool.pause_generation()  # what a weight sync does
        assert await pool.health() == {url: False}  # SGLang's /health: 503 after waiting
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg, watchdog.suspended():
                tg.start_soon(watchdog.run)
                while watchdog.skipped < 3:  # three rounds fell inside the sync
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
            # a failed sync leaves the pool paused: the watchdog asks whether it lives, not whether it generates
            assert await watchdog.check(checks_needed=1, probe="alive") is False
            assert restarted == []
            await pool.continue_generation()
            assert await watchdog.check(checks_needed=1) is False and restarted == []
            driver.shutdown()  # the engine dies
            assert await watchdog.check(checks_needed=1, probe="alive") is True
        assert restarted == [url] and watchdog.restarts == 1


async def test_a_weight_sync_that_hangs_stops_the_run():
    from agentrl_core.jobs.training import Trainer, WeightSyncTimeout

    class StuckLearners:
        async def sync(self, pools, version):
            await anyio.sleep_forever()

    class Stuck:
        learner = StuckLearners()

    config = config_from_dict({"model": {"path": "/m"}, "tasks": [{"env": "calc"}],
                               "weight_sync": {"timeout_s": 0.2}}, validate_plugins=False)
    trainer = Trainer(config)
    trainer.pools, trainer.step, trainer.learner_lock = Stuck(), 3, anyio.Lock()
    trainer.watchdog = EngineWatchdog({}, restart=None, interval=1.0, unhealthy_checks=1, max_restarts=0)
    trainer.sync_margin_s = 0.1
    with anyio.fail_after(30):  # the guard of this test: before, the call waited forever
        with pytest.raises(WeightSyncTimeout, match="the weight sync of step 3 to current did not finish within 0.5 s"):
            await trainer._sync(["current"])


async def test_the_trainer_suspends_the_watchdog_while_it_syncs_and_retries(sglang_engine):
    """Through Trainer._sync: a sync that fails and its retry each keep the SGLang engine paused
    longer than /health takes to answer 503 there (1 s here); the watchdog, probing every 50 ms,
    restarts nothing. Without the trainer's suspension it would restart the healthy engine."""
    from agentrl_core.jobs.training import Trainer
    from agentrl_core.train.weight_sync import WeightSyncError

    driver, url = sglang_engine
    restarted = []

    async def restart(pool, engine):
        restarted.append(engine)
        return engine

    class Learners:
        """TEST DOUBLE of the learner group: a sync pauses the pool as a transport does and takes
        2.5 s (gathering and sending); the first one fails and leaves the pool paused."""

        def __init__(self, pool):
            self.pool, self.calls = pool, 0

        async def sync(self, pools, version):
            self.calls += 1
            await self.pool.pause_generation()
            await anyio.sleep(2.5)
            if self.calls == 1:
                raise WeightSyncError("weight version 3, bucket 0: an engine refused it")
            await self.pool.continue_generation()
            return {"weight_sync/current/seconds": 2.5}

    config = config_from_dict({"model": {"path": "/m"}, "tasks": [{"env": "calc"}]}, validate_plugins=False)
    async with EnginePool("current", [url], health_timeout=10) as pool:
        trainer = Trainer(config)
        learners = Learners(pool)
        trainer.pools = type("Pools", (), {"learner": learners})()
        trainer.step, trainer.learner_lock = 3, anyio.Lock()
        trainer.watchdog = EngineWatchdog({"current": pool}, restart=restart, interval=0.05, unhealthy_checks=1,
                                          max_restarts=5)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(trainer.watchdog.run)
                assert await trainer._sync(["current"]) == {"weight_sync/current/seconds": 2.5}
                tg.cancel_scope.cancel()
    assert learners.calls == 2 and restarted == []
    assert trainer.watchdog.skipped >= 40  # it did run: ~50 rounds fell inside the two syncs
