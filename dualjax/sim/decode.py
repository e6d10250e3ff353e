"""The decode side of the simulation: DE engines decoding continuous batches, modelled as a fluid.

Between joins and leaves every member of a DE's batch advances at the batch's step time, so the
cost is an event per join and leave, not per token. A step is the HBM roofline (weights of the
DE's expert-parallel share, the batch's KV and indexer keys) overlapped with its EP all-to-all,
which takes the longer of its bytes over the DE's compute NIC (model traffic: high priority;
without priority it shares the line with KV transfers queued there) and the latency floor of the
low-latency kernels (per MoE layer a dispatch and a combine, `Costs.ep_latency_s`), plus a fixed
per-step overhead. Before decoding, the prompt's KV moves from the DE buffer into the DE's HBM (a
loopback over its compute NIC: the second DE DRAM read of docs/paper.md §8). Full blocks are
written back (counted, not queued).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from dualjax.core.lengths import kv_blocks
from dualjax.sim.resources import Costs, Lane, Node, carry_model, latest, model_line_rate


class DecodeEngine:
    """A continuous decode batch as a fluid: `steps` advance at 1/step_s between membership changes."""

    __slots__ = ("rank", "node", "tx", "rx", "members", "n", "ready", "steps", "t_ref", "step_s", "ctx_base",
                 "version", "busy_s", "costs", "ep_nodes", "ep_floor_s", "kv_cap", "kv_free", "kv_wait")

    def __init__(self, rank: int, node: Node, tx: Lane, rx: Lane, costs: Costs, ep_nodes: int = 1,
                 kv_tokens: float = math.inf):
        self.rank, self.node, self.tx, self.rx, self.ep_nodes = rank, node, tx, rx, ep_nodes
        # KV tokens its HBM holds; those not taken by requests moved in; requests whose prompt KV waits in the
        # DE buffer for room (FIFO)
        self.kv_cap = self.kv_free = kv_tokens
        self.kv_wait: deque[int] = deque()
        self.costs = costs  # its EP group's: the weights each step reads depend on the group's size
        self.ep_floor_s = costs.ep_latency_s(costs.de_ep)  # the EP all-to-all's latency floor per step
        self.members: list[tuple[float, int]] = []  # heap of (finish step, request id)
        self.n, self.ready = 0, deque()
        self.steps = self.t_ref = self.step_s = self.busy_s = 0.0
        self.ctx_base = 0.0  # sum over members of (prompt - join step): context = ctx_base + n * steps
        self.version = 0


class DecodeSide:
    """Mixin of `Simulation`: from the prompt's KV reaching the DE to the last token (the first token is the
    PE's: its last prefill pass samples it, `PrefillSide._end_member_pass`)."""

    def _join(self, de: DecodeEngine, rid: int) -> None:
        """Prefill has ended and the prompt KV is in the DE buffer: it moves into HBM once the HBM has room
        for its prompt + generation tokens (FIFO behind any waiting; docs/paper.md §3)."""
        if de.kv_wait or self.cols.prompt_tokens[rid] + self.cols.gen_len[rid] > de.kv_free:
            de.kv_wait.append(rid)
        else:
            self._move_in(de, rid)

    def _kv_room(self, de: DecodeEngine) -> None:
        """HBM was freed: the prompt KV waiting in the DE buffer moves in, in order, while it fits."""
        c, wait = self.cols, de.kv_wait
        while wait and c.prompt_tokens[wait[0]] + c.gen_len[wait[0]] <= de.kv_free:
            self._move_in(de, wait.popleft())

    def _move_in(self, de: DecodeEngine, rid: int) -> None:
        """Take the request's HBM (the scheduler's resident memory too) and move its prompt KV from the DE
        buffer into HBM (loopback); then it may decode."""
        now, c = self.now, self.cols
        need = c.prompt_tokens[rid] + c.gen_len[rid]
        de.kv_free -= need
        self.scheduler.kv_in(de.rank, need)
        if not self.reserved:  # reserved: taken at placement, where it is noted
            self._note_de_memory(de)
        nbytes = c.prompt_tokens[rid] * self.kvb
        done = de.node.dram.reserve(now, nbytes)
        if self.hw.loopbacks:
            done = latest(done, de.tx.reserve(now, nbytes), de.rx.reserve(now, nbytes))
            if not self.kv_priority:
                self._kv_queued(de)
        if done > now:
            self.at(done, self._in_hbm, de, rid)
        else:
            self._in_hbm(de, rid)

    def _in_hbm(self, de: DecodeEngine, rid: int) -> None:
        """The prompt KV is in the DE's HBM (the first token came with the prefill's end): the DE buffer is
        free, and the request joins the batch; its second token comes with the DE's next step (`_admit`)."""
        c = self.cols
        de.node.buffer.release(c.prompt_tokens[rid] * self.kvb)
        if c.gen_len[rid] <= 1:
            self._complete(de, rid)
            return
        de.ready.append(rid)
        self._advance(de)
        self._admit(de)

    def _kv_queued(self, de: DecodeEngine) -> None:
        """KV was queued on `de`'s compute NIC. Without priority it slows the EP all-to-all of the batch's
        steps until the NIC drains (re-timed now and then); with priority nothing changes."""
        if self.kv_priority or not de.n:
            return
        self._advance(de)
        self._retime(de)
        self.at(max(de.tx.free_at, de.rx.free_at), self._kv_drained, de)

    def _kv_drained(self, de: DecodeEngine) -> None:
        if de.n:
            self._advance(de)
            self._retime(de)

    def _advance(self, de: DecodeEngine) -> None:
        if de.n:
            de.steps += (self.now - de.t_ref) / de.step_s
            de.busy_s += self.now - de.t_ref
        de.t_ref = self.now

    def _admit(self, de: DecodeEngine) -> None:
        """Ready requests join the batch (advanced to now by the caller), up to `Hardware.decode_batch`."""
        limit = self.decode_limit
        ready = de.ready
        if not ready or de.n >= limit:
            self._retime(de)
            return
        c = self.cols
        gen, prompt, steps = c.gen_len, c.prompt_tokens, de.steps
        joined = []
        while ready and de.n < limit:
            rid = ready.popleft()
            heapq.heappush(de.members, (steps + gen[rid] - 1, rid))
            de.ctx_base += prompt[rid] - steps
            de.n += 1
            joined.append(rid)
        self._retime(de)
        second, t = c.second_token, self.now + de.step_s
        for rid in joined:
            second[rid] = t  # the second token comes with the next step

    def _slowdown(self, engine) -> float:
        """`local`: engines share the machine's cores; how much the others computing slow this one."""
        others = sum(1 for e in self.engines.values()
                     if e is not engine and (e.group.busy if hasattr(e, "group") else e.n))
        return self.slow[type(engine)][others]

    def _retime_decoders(self) -> None:
        for e in self.decoders:
            if e.n:
                self._advance(e)
                self._retime(e)

    def _retime(self, de: DecodeEngine) -> None:
        de.version += 1
        n, now = de.n, self.now
        if not n:
            carry_model(de.tx, de.rx, 0.0)
            return
        ep = de.costs.ep_bytes(n, de.ep_nodes)
        ep_s = 0.0
        if ep:
            ep_s = ep / model_line_rate(de.tx, de.rx, now)
        floor = de.ep_floor_s
        step_s = de.costs.decode_step_s(n, de.ctx_base + n * de.steps, ep_s if ep_s > floor else floor)
        if self.shared:
            step_s *= self._slowdown(de)
        de.step_s = step_s
        util = ep_s / step_s  # its bytes' share of the line
        carry_model(de.tx, de.rx, util if util < 1.0 else 1.0)
        left = de.members[0][0] - de.steps  # steps until the first member finishes
        heapq.heappush(self.events, (now + (left if left > 0.0 else 0.0) * step_s, self.tick(),
                                     self._decode_event, (de, de.version)))

    def _decode_event(self, de: DecodeEngine, version: int) -> None:
        if version != de.version:
            return  # the batch changed since this was due
        self._advance(de)
        members, prompt, gen = de.members, self.cols.prompt_tokens, self.cols.gen_len
        while members and members[0][0] <= de.steps + 1e-6:
            finish, rid = heapq.heappop(members)
            de.n -= 1
            de.ctx_base -= prompt[rid] - (finish - gen[rid] + 1)
            self._complete(de, rid)
        if de.ready:
            self._admit(de)
        else:  # nothing waits to join: re-time the batch
            self._retime(de)

    def _complete(self, de: DecodeEngine, rid: int) -> None:
        c, now = self.cols, self.now
        c.done[rid] = now
        gen, prompt, hit = c.gen_len[rid], c.prompt_tokens[rid], c.hit_tokens[rid]  # Python ints
        if gen > 1:
            c.tpot[rid] = (now - c.first_token[rid]) / (gen - 1)
        else:
            c.second_token[rid] = np.nan
        if self.cfg.use_store:  # every block that filled and the store lacks (a plan's recomputed tail it holds)
            stored = (hit + c.recomputed_tokens[rid]) // self.block_tokens
            de.node.write_bytes += (kv_blocks(prompt + gen, self.block_tokens) - stored) * self.block_tokens * self.kvb
        self.scheduler.update(de.rank, -1, -(prompt + gen))
        de.kv_free += prompt + gen
        if de.kv_wait:  # after this event: it may be in the middle of the batch's step (`_decode_event`)
            self.at(now, self._kv_room, de)
        self.dirty = True
        self.completed += 1
        agent = c.agent[rid]
        self.context[agent] = prompt + gen
        self.next_turn[agent] = k = self.next_turn[agent] + 1
        if k < len(self.append[agent]):
            if self.trace is not None and self.trace.pause[agent][k] > 0:  # recorded
                self.at(now + float(self.trace.pause[agent][k]), self._submit, agent)
            elif self.think_s and self.trace is None:
                self.at(now + self.rng.exponential(self.think_s), self._submit, agent)
            else:
                self._submit(agent)
