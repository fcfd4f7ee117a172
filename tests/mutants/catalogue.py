"""The rule mutants: each one a small, realistic bug in one of the product's safety rules, and the
fast tests (tests/unit, tests/sim) that must catch it.

`scripts/mutants` applies each mutant to a throwaway copy of the tree and runs its catching tests
there: they must pass on the unmutated copy, fail on the mutant, and do so within
`TIME_LIMIT_S`. tests/unit/test_mutant_catalogue.py checks, cheaply, that every `original` still
occurs exactly once in today's code and that every catching test exists, so a refactor that moves
a rule's code shows up in the fast tests, not only in the mutant run.

To add a mutant, append one `Mutant` to `MUTANTS`: a bug a person could plausibly write (a
dropped condition, a flipped comparison, a skipped check, an early return), not sabotage such as
`raise`. `scripts/mutants --survey ID` lists every fast test that fails on it, to choose from;
list the most focused one first (the mutant run stops at the first failure, `-x`).
"""

from __future__ import annotations

from dataclasses import dataclass

TIME_LIMIT_S = 60.0  # per mutant, wall time, catching tests included (startup, imports, fixtures)
FAST_TIERS = ("tests/unit/", "tests/sim/")


@dataclass(frozen=True)
class Mutant:
    id: str  # short, unique, kebab-case: what the bug does
    rule: str  # the rule it breaks, one sentence
    file: str  # relative to the repository's root
    original: str  # must occur exactly once in `file`
    replacement: str
    caught_by: tuple[str, ...]  # pytest node ids in tests/unit or tests/sim

    @property
    def module(self) -> str:
        """The dotted name `file` is imported as."""
        return self.file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


MUTANTS: list[Mutant] = [
    # ------------------------------------------------------------------ fences
    Mutant(
        id="engine-ignores-result-fence",
        rule="The engine applies a batch's results only if they carry the fence of its open attempt.",
        file="orchestrator/engine/attempts.py",
        original="if att is not None and att.device_id == dev.id and att.fence == msg.fence:",
        replacement="if att is not None and att.device_id == dev.id:",
        caught_by=(
            "tests/unit/engine/test_rule_guards.py::test_results_under_an_older_fence_than_their_attempts_are_refused_and_not_applied",
        ),
    ),
    Mutant(
        id="ledger-runs-stale-batch",
        rule="The agent's ledger refuses a batch whose fence is older than the newest one it accepted.",
        file="device_agent/ledger.py",
        original=(
            "            elif batch.fence < self.max_fence:\n"
            "                receipt = Receipt.STALE\n"
            "            else:\n"
        ),
        replacement="            else:\n",
        caught_by=(
            "tests/unit/device_agent/test_ledger.py::test_a_batch_older_than_the_newest_fence_is_stale",
            "tests/unit/device_agent/test_agent_protocol.py::test_a_stale_batch_is_answered_with_skipped_results_and_the_mark_and_never_runs",
        ),
    ),
    # ------------------------------------------------------------------ retry safety
    Mutant(
        id="retry-if-any-tool-safe",
        rule="A failed attempt that started runs again only if every tool it ran is read-only or idempotent.",
        file="orchestrator/domain/retry.py",
        original="return all(read_only or idempotent for read_only, idempotent in tool_hints)",
        replacement="return any(read_only or idempotent for read_only, idempotent in tool_hints)",
        caught_by=(
            "tests/unit/engine/test_rule_guards.py::test_a_failure_after_a_read_only_command_and_an_action_ran_is_not_run_again",
        ),
    ),
    Mutant(
        id="approval-denial-retried",
        rule="A node whose command a person denied fails approval_denied and is never run again.",
        file="orchestrator/domain/retry.py",
        original='        "approval_denied",\n',
        replacement="",
        caught_by=(
            "tests/unit/engine/test_rule_guards.py::test_a_denied_command_fails_its_node_for_good_despite_tries_left",
        ),
    ),
    # ------------------------------------------------------------------ one writer
    Mutant(
        id="commit-without-lease",
        rule="Every engine commit carries the engine lease, so a leader that lost it writes nothing.",
        file="orchestrator/engine/writer.py",
        original="            changes.guard = self.lease_guard\n",
        replacement="",
        caught_by=("tests/unit/engine/test_writer.py::test_effects_and_events_follow_a_commit_and_never_a_failed_one",),
    ),
    Mutant(
        id="store-ignores-lease-fence",
        rule="The store refuses a guarded commit whose lease fence is no longer the lease's current one.",
        file="orchestrator/store/pg_writer.py",
        original='    " AND holder = ${n1}::text AND fence = ${n2}::bigint AND expires_at > now() FOR UPDATE) AS l)"\n',
        replacement='    " AND holder = ${n1}::text AND ${n2}::bigint > 0 AND expires_at > now() FOR UPDATE) AS l)"\n',
        caught_by=(
            "tests/unit/store/test_lease_guard.py::test_a_writer_whose_lease_went_to_another_and_came_back_cannot_write_under_its_old_fence",
        ),
    ),
    Mutant(
        id="store-commit-skips-lease-check",
        rule="A guarded commit begins by checking and locking the lease row: a writer that lost it writes nothing.",
        file="orchestrator/store/pg_writer.py",
        original="        if not guarded:\n",
        replacement="        if True:\n",
        caught_by=(
            "tests/unit/store/test_pg_writer.py::test_a_guarded_commit_under_a_lost_lease_writes_nothing_and_the_writer_goes_on",
            "tests/unit/store/test_lease_guard.py::test_a_writer_whose_lease_expired_or_was_taken_over_writes_nothing",
        ),
    ),
    Mutant(
        id="store-lease-check-ignores-expiry",
        rule="A guarded commit writes only while its lease is unexpired, not merely still named for it.",
        file="orchestrator/store/pg_writer.py",
        original='    " AND holder = ${n1}::text AND fence = ${n2}::bigint AND expires_at > now() FOR UPDATE) AS l)"\n',
        replacement='    " AND holder = ${n1}::text AND fence = ${n2}::bigint FOR UPDATE) AS l)"\n',
        caught_by=(
            "tests/unit/store/test_lease_guard.py::test_a_writer_whose_lease_expired_or_was_taken_over_writes_nothing",
        ),
    ),
    Mutant(
        id="redis-burst-fails-fast",
        rule="A replica's Redis command waits for a free connection of its pool, never fails for want of one.",
        file="orchestrator/cluster/replicas.py",
        original="    pool = aioredis.BlockingConnectionPool.from_url(\n        url,\n        timeout=REDIS_OP_S,\n",
        replacement="    pool = aioredis.ConnectionPool.from_url(\n        url,\n",
        caught_by=(
            "tests/unit/test_redis_client.py::test_a_burst_beyond_the_pool_waits_for_connections_and_loses_nothing",
        ),
    ),
    Mutant(
        id="follower-fleet-never-read-again",
        rule="A follower reads the devices again whenever the store's device catalogue version moved.",
        file="orchestrator/cluster/replicas.py",
        original="if fresh or version is None or self._fleet is None or self._fleet[0] != version:",
        replacement="if fresh or version is None or self._fleet is None:",
        caught_by=(
            "tests/unit/store/test_device_catalog.py::test_a_follower_validates_against_its_copy_and_reads_it_again_when_the_version_moved",
        ),
    ),
    Mutant(
        id="device-catalog-counted-at-each-change",
        rule="The device catalogue version is counted at commit: unseen before it, no lock held long.",
        file="migrations/versions/0013_device_catalog_version.py",
        original=" ON devices DEFERRABLE INITIALLY DEFERRED",
        replacement=" ON devices NOT DEFERRABLE INITIALLY IMMEDIATE",
        caught_by=(
            "tests/unit/store/test_device_catalog.py::test_on_postgres_a_change_counts_at_its_commit_and_two_writers_never_wait_on_the_count",
        ),
    ),
    Mutant(
        id="device-catalog-blind-to-liveness",
        rule="Every device column a submission's checks read moves the catalogue version (its liveness too).",
        file="migrations/versions/0013_device_catalog_version.py",
        original='    "liveness",\n',
        replacement="",
        caught_by=(
            "tests/unit/store/test_device_catalog.py::test_every_column_a_follower_reads_of_a_device_is_watched_but_the_engines_bookkeeping",
        ),
    ),
    Mutant(
        id="relay-waits-out-a-dead-leaders-try",
        rule="A follower's unanswered requests are asked again as soon as another replica announces it leads.",
        file="orchestrator/cluster/replicas.py",
        original="                    await self._try_lead()\n                self._ask_again()\n",
        replacement="                    await self._try_lead()\n",
        caught_by=(
            "tests/unit/test_relay_new_leader.py::test_a_request_is_asked_again_at_once_when_a_new_leader_announces_itself",
        ),
    ),
    Mutant(
        id="lease-taken-after-a-postgres-restart",
        rule="A session ended by a Postgres restart since the lease's last renewal does not count as a dead holder.",
        file="orchestrator/store/pg_writer.py",
        original="        OR (l.holder_pid IS NOT NULL AND l.renewed_at > pg_postmaster_start_time()\n",
        replacement="        OR (l.holder_pid IS NOT NULL\n",
        caught_by=(
            "tests/unit/store/test_lease_guard.py::test_a_lease_whose_holder_session_ended_with_a_postgres_restart_waits_for_its_expiry",
        ),
    ),
    Mutant(
        id="lease-taken-from-a-live-holder",
        rule="A lease is taken before its expiry only when its holder's Postgres session is gone.",
        file="orchestrator/store/pg_writer.py",
        original="            AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = l.holder_pid)))\n",
        replacement="            ))\n",
        caught_by=(
            "tests/unit/store/test_lease_guard.py::test_a_lease_whose_holder_session_is_gone_is_taken_at_once_and_its_old_holder_writes_nothing",
        ),
    ),
    Mutant(
        id="mcp-server-sets-up-root-logging",
        rule="Building the MCP server leaves the process's logging alone (the MCP SDK's basicConfig does nothing).",
        file="orrery/mcp_server.py",
        original="    root.addHandler(placeholder)\n",
        replacement="    pass\n",
        caught_by=(
            "tests/unit/test_mcp_server_build.py::test_building_the_server_adds_no_handler_and_changes_no_level_of_the_root_logger",
        ),
    ),
    Mutant(
        id="store-split-commit-skips-lease-check",
        rule="A guarded commit in two statements checks the lease in the first: a writer that lost it writes nothing.",
        file="orchestrator/store/pg_writer.py",
        original="            return [self._statement(first, guard), self._statement(rest, None)]\n",
        replacement="            return [self._statement(first, None), self._statement(rest, None)]\n",
        caught_by=(
            "tests/unit/store/test_pg_writer.py::test_a_guarded_commit_under_a_lost_lease_writes_nothing_and_the_writer_goes_on",
        ),
    ),
    Mutant(
        id="store-updates-a-row-before-its-insert",
        rule="A row inserted and updated in one commit is inserted first: a statement sees rows as they were before.",
        file="orchestrator/store/pg_writer.py",
        original="        if first and rest and _touched_again(inserts, updates, deletes):\n",
        replacement="        if first and rest and _touched_again(inserts, [], deletes):\n",
        caught_by=(
            "tests/unit/store/test_pg_writer.py::test_the_postgres_group_commit_writes_the_rows_sqlalchemy_writes",
        ),
    ),
    # ------------------------------------------------------------------ sha256 on both ends
    Mutant(
        id="upload-trusts-declared-sha256",
        rule="The orchestrator records an upload only if its bytes have the sha256 it was declared with.",
        file="orchestrator/artifacts/uploads.py",
        original="digest = await self._digest(row)",
        replacement="digest = row.sha256",
        caught_by=(
            "tests/unit/artifacts/test_uploads.py::test_content_that_is_not_the_declared_sha256_is_refused_and_nothing_is_recorded[sqlite/files]",
        ),
    ),
    Mutant(
        id="download-trusts-announced-sha256",
        rule="The agent keeps a downloaded artifact only if its bytes have the sha256 the orchestrator announced.",
        file="device_agent/artifacts.py",
        original="                return hasher.hexdigest()\n",
        replacement="                return digest\n",
        caught_by=(
            "tests/unit/device_agent/test_download_checks.py::test_a_download_whose_sha256_does_not_match_is_refused_and_leaves_nothing",
        ),
    ),
    # ------------------------------------------------------------------ emergency stop
    Mutant(
        id="placement-takes-stopped-device",
        rule="Placement gives no work to a device that is stopped (emergency stop).",
        file="orchestrator/domain/placement.py",
        original="return self.admin is AdminState.ACTIVE and self.liveness is Liveness.ONLINE",
        replacement=(
            "return self.admin not in (AdminState.DRAINING, AdminState.CORDONED, AdminState.REVOKED) "
            "and self.liveness is Liveness.ONLINE"
        ),
        caught_by=(
            "tests/unit/domain/test_stopped_placement.py::test_a_stopped_device_takes_no_work_but_could_run_it_once_resumed",
            "tests/unit/domain/test_stopped_placement.py::test_a_node_goes_to_the_device_in_service_and_never_to_the_stopped_one",
        ),
    ),
    Mutant(
        id="engine-places-on-stopped-device",
        rule="The engine sends no batch to a device that is stopped (emergency stop).",
        file="orchestrator/engine/queues.py",
        original="if d.admin is not active or d.liveness is not online:",
        replacement="if d.admin in (AdminState.CORDONED, AdminState.DRAINING) or d.liveness is not online:",
        caught_by=(
            "tests/unit/engine/test_rule_guards.py::test_a_stopped_device_is_given_no_work_until_it_is_resumed",
        ),
    ),
    Mutant(
        id="stopped-device-takes-queued-work",
        rule="A stopped device (emergency stop) takes no node waiting in another device's queue.",
        file="orchestrator/engine/queues.py",
        original="return dev.admin is AdminState.ACTIVE and dev.liveness is Liveness.ONLINE",
        replacement=(
            "return dev.admin not in (AdminState.DRAINING, AdminState.CORDONED, AdminState.REVOKED) "
            "and dev.liveness is Liveness.ONLINE"
        ),
        caught_by=("tests/unit/engine/test_rule_guards.py::test_work_goes_past_a_stopped_device_to_one_in_service",),
    ),
    # ------------------------------------------------------------------ fan-out
    Mutant(
        id="canary-failure-ignored",
        rule="A failed canary halts the fan-out: the rest are skipped and the node fails canary_failed.",
        file="orchestrator/domain/fanout.py",
        original="        if self.canary_bad:\n            return Halt.CANARY_FAILED\n",
        replacement="",
        caught_by=(
            "tests/unit/engine/test_fanouts.py::test_a_failed_canary_skips_the_rest_and_fails_the_node_canary_failed",
            "tests/unit/domain/test_fanout.py::test_every_rollout_ends_by_its_rules_whatever_its_children_do",
        ),
    ),
    Mutant(
        id="failure-budget-off-by-one",
        rule="A fan-out with failure budget K starts no more children once K of them failed.",
        file="orchestrator/domain/fanout.py",
        original="if self.budget is not None and self.failed >= self.budget:",
        replacement="if self.budget is not None and self.failed > self.budget:",
        caught_by=(
            "tests/unit/engine/test_fanouts.py::test_the_failure_budget_stops_the_rollout_at_its_kth_failed_child",
            "tests/unit/domain/test_fanout.py::test_every_rollout_ends_by_its_rules_whatever_its_children_do",
        ),
    ),
    # ------------------------------------------------------------------ schedules
    Mutant(
        id="schedule-advances-from-now",
        rule="A schedule's next tick is after both now and its last recorded tick, whatever the leader's clock says.",
        file="orchestrator/engine/schedules.py",
        original="entry.next_at = entry.cron.after(max(now, entry.last_tick or now))",
        replacement="entry.next_at = entry.cron.after(now)",
        caught_by=(
            "tests/unit/engine/test_schedule_clock.py::test_a_schedule_resumed_by_a_leader_whose_clock_is_behind_waits_for_the_tick_after_its_last",
        ),
    ),
    # ------------------------------------------------------------------ device controls (desired state)
    Mutant(
        id="breach-lowers-stop",
        rule="A safety breach never lowers an emergency stop: a stopped device stays stopped, the breach recorded.",
        file="orchestrator/domain/controls.py",
        original=(
            "    if current.stopped:\n"
            '        return Change(_with(current, breach=reason), f"{reason} (while stopped: it stays stopped)", '
            "current.gen)\n"
        ),
        replacement="",
        caught_by=("tests/unit/engine/test_controls.py::test_a_breach_never_lowers_a_stop_and_only_resume_lifts_it",),
    ),
    Mutant(
        id="uncordon-lifts-stop",
        rule="Only a resume lifts a stop: a drain, cordon or uncordon of a stopped device is refused.",
        file="orchestrator/domain/controls.py",
        original="if current.stopped and action is not ControlAction.REVOKE:",
        replacement="if current.stopped and action not in (ControlAction.REVOKE, ControlAction.UNCORDON):",
        caught_by=("tests/unit/engine/test_controls.py::test_a_breach_never_lowers_a_stop_and_only_resume_lifts_it",),
    ),
    Mutant(
        id="resume-on-stale-controls",
        rule=(
            "A resume or uncordon applies only to the controls it was asked on, so a late one cannot lift a newer stop."
        ),
        file="orchestrator/domain/controls.py",
        original="        and expect_gen != current.gen\n",
        replacement="        and expect_gen > current.gen\n",
        caught_by=(
            "tests/unit/engine/test_controls.py::test_a_resume_asked_on_controls_that_changed_since_is_refused",
        ),
    ),
    Mutant(
        id="control-sent-once",
        rule="A device's control state is sent again until the device reports its generation applied.",
        file="orchestrator/engine/controls.py",
        original="elif applied < dev.control_gen and (connected or now - dev.control_sent_at >= RESEND_AFTER_S):",
        replacement="elif applied < dev.control_gen and connected:",
        caught_by=(
            "tests/unit/engine/test_controls.py::test_a_stop_is_sent_again_until_the_device_reports_it_applied",
        ),
    ),
    Mutant(
        id="agent-applies-older-control",
        rule="The agent applies only a control state newer than the one its ledger holds.",
        file="device_agent/agent.py",
        original="if same and state.gen <= applied.gen:",
        replacement="if same and state.gen == applied.gen:",
        caught_by=(
            "tests/unit/device_agent/test_agent_stop.py::test_an_older_control_state_arriving_late_changes_nothing",
        ),
    ),
    Mutant(
        id="cancel-sent-once",
        rule="A cancel is sent again while the device says it still runs the cancelled batch.",
        file="orchestrator/engine/fleet.py",
        original=(
            "if running is not None and (att is None or att.device_id != dev.id or att.cancel_reason is not None):"
        ),
        replacement="if running is not None and (att is None or att.device_id != dev.id):",
        caught_by=(
            "tests/unit/engine/test_controls.py::test_a_cancel_lost_on_its_way_is_sent_again_while_the_device_still_runs_the_batch",
        ),
    ),
    Mutant(
        id="accepted-batch-never-resent",
        rule="A batch open on a device that heartbeats idle is sent again, even one it accepted before a restart.",
        file="orchestrator/engine/fleet.py",
        original="            and waiting.kind in (AttemptKind.TOOL, AttemptKind.VERIFY)\n",
        replacement=(
            "            and waiting.kind in (AttemptKind.TOOL, AttemptKind.VERIFY)\n"
            "            and not waiting.accepted\n"
        ),
        caught_by=(
            "tests/unit/engine/test_guarantees.py::test_an_accepted_batch_an_agent_lost_in_a_restart_is_sent_again_when_it_idles",
        ),
    ),
    Mutant(
        id="resume-skips-the-stops-kill",
        rule="A stop the agent hears of only with the resume after it still ends the command that ran.",
        file="device_agent/agent.py",
        original="if state.stopped_at > before and not latch.stopped:",
        replacement="if state.stopped_at > before and latch.stopped:",
        caught_by=(
            "tests/unit/device_agent/test_agent_stop.py::"
            "test_a_stop_and_a_resume_heard_together_still_end_the_running_command",
        ),
    ),
    # ------------------------------------------------------------------ approvals (the device's ledger arbitrates)
    Mutant(
        id="store-records-a-request-as-the-decision",
        rule="The store records an approval's decision only when its device reports it; a request is only a request.",
        file="orchestrator/engine/approvals.py",
        original="            requested_state=state,\n",
        replacement="            state=state,\n            requested_state=state,\n",
        caught_by=(
            "tests/unit/engine/test_approvals.py::test_an_operators_decision_is_asked_of_the_device_and_holds_only_once_it_confirms",
        ),
    ),
    Mutant(
        id="approval-after-cancel-accepted",
        rule="An approval for an attempt that was cancelled (or ended) is refused: nothing of it may run.",
        file="orchestrator/engine/approvals.py",
        original='if att is None or att.cancel_reason is not None or e.requested == "cancelled":',
        replacement="if att is None:",
        caught_by=(
            "tests/unit/engine/test_approvals.py::test_an_approval_after_its_task_was_cancelled_is_refused_and_the_device_asked_to_cancel",
        ),
    ),
    Mutant(
        id="approval-request-asked-once",
        rule="A decision asked of a device is asked again until the device reports one.",
        file="orchestrator/engine/approvals.py",
        original="if e.requested is not None and now - e.sent_at >= RESEND_AFTER_S:",
        replacement="if e.requested is not None and e.sent_at == -math.inf:",
        caught_by=("tests/unit/engine/test_approvals.py::test_the_expiry_is_asked_again_until_the_device_confirms_it",),
    ),
    Mutant(
        id="refused-attempt-retried",
        rule="An attempt whose approval was denied ends approval_denied however it ends (never retried).",
        file="orchestrator/engine/runs.py",
        original="if att.refused is not None and not outcome.succeeded and outcome.error_code != att.refused:",
        replacement="if att.refused is not None and not outcome.succeeded and outcome.started is False:",
        caught_by=(
            "tests/unit/engine/test_approvals.py::test_an_attempt_whose_approval_was_denied_ends_refused_however_it_ends[False]",
        ),
    ),
    Mutant(
        id="restart-forgets-a-denial",
        rule="A restart restores the decided approvals of open attempts: a denial stays final across it.",
        file="orchestrator/engine/approvals.py",
        original="if att is not None and row.state in REFUSALS:",
        replacement='if att is not None and row.state == "pending":',
        caught_by=(
            "tests/unit/engine/test_approvals.py::test_an_attempt_whose_approval_was_denied_ends_refused_however_it_ends[True]",
        ),
    ),
    # ------------------------------------------------------------------ a command does not outlive its agent
    Mutant(
        id="restart-leaves-orphans",
        rule="A restarted agent kills what its last run left running before it reports the interrupted call.",
        file="device_agent/agent.py",
        original="            notes = await end_orphans(self.ledger)\n",
        replacement="            notes = {}\n",
        caught_by=(
            "tests/unit/device_agent/test_orphans.py::"
            "test_a_restarted_agent_kills_what_its_last_run_left_running_before_it_says_hello",
        ),
    ),
    # ------------------------------------------------------------------ nothing a device sends stops the engine
    Mutant(
        id="device-text-takes-nul",
        rule="A NUL in a device's free text is refused at the protocol boundary as malformed_frame.",
        file="protocol/text.py",
        original='_BAD_IN_TEXT = re.compile("[\\x00-\\x08',
        replacement='_BAD_IN_TEXT = re.compile("[\\x01-\\x08',
        caught_by=(
            "tests/unit/protocol/test_device_text.py::"
            "test_text_the_store_cannot_hold_is_a_malformed_frame_naming_the_field[text0-approval_request.reason]",
        ),
    ),
    Mutant(
        id="refused-input-stops-engine",
        rule="An input whose changes the store refuses for their data is left out; the engine goes on.",
        file="orchestrator/engine/writer.py",
        original="            except Exception as exc:\n                if not refused_data(exc):\n",
        replacement="            except Exception as exc:\n                if not isinstance(exc, DBAPIError):\n",
        caught_by=(
            "tests/unit/engine/test_input_isolation.py::"
            "test_an_input_the_store_refuses_is_left_out_and_the_rest_of_its_step_commits",
        ),
    ),
    Mutant(
        id="refused-input-leaves-task-running",
        rule=(
            "A device input the store refuses ends that device's work on the tasks it touched "
            "(input_refused), so memory and the store agree and the task goes on."
        ),
        file="orchestrator/engine/isolation.py",
        original="            if isinstance(item, FrameIn):\n                self._end_work(",
        replacement=(
            "            if isinstance(item, FrameIn) and item.device_id in device_ids:\n"
            "                self._end_work("
        ),
        caught_by=(
            "tests/unit/engine/test_input_isolation.py::"
            "test_an_input_the_store_refuses_is_left_out_and_the_rest_of_its_step_commits",
        ),
    ),
    # ------------------------------------------------------------------ takeovers
    Mutant(
        id="stop-keeps-takeover",
        rule="An emergency stop ends a takeover with everything else (a stop still ends everything).",
        file="orchestrator/domain/controls.py",
        original=(
            '        after = _with(after, taken_over_by=None, takeover_since=0.0, takeover_reason="")'
            "  # a stop ends it\n"
        ),
        replacement="",
        caught_by=(
            "tests/unit/engine/test_takeovers.py::"
            "test_a_stop_ends_a_takeover_and_a_takeover_of_a_stopped_device_is_refused",
        ),
    ),
    Mutant(
        id="step-sent-during-owner-takeover",
        rule="An agent node's step is held while a person has its device, the owner at the device included.",
        file="orchestrator/engine/takeovers.py",
        original="        if dev.taken_over:\n",
        replacement="        if dev.taken_over_by is not None:\n",
        caught_by=(
            "tests/unit/engine/test_takeovers.py::"
            "test_the_owners_takeover_at_the_device_pauses_its_agent_node_like_an_operators",
        ),
    ),
    Mutant(
        id="takeover-time-counts-to-timeout",
        rule="The time a person has the device does not count against its agent node's timeout_s.",
        file="orchestrator/engine/runs.py",
        original="paused = att is not None and (att.waiting_since is not None or att.paused_since is not None)",
        replacement="paused = att is not None and att.waiting_since is not None",
        caught_by=(
            "tests/unit/engine/test_takeovers.py::test_takeover_time_does_not_count_against_the_agent_nodes_timeout",
        ),
    ),
    Mutant(
        id="taken-over-device-takes-work",
        rule="A device a person has taken over is given no new batch until the handback.",
        file="orchestrator/engine/queues.py",
        original="and dev.liveness is Liveness.ONLINE and not dev.taken_over",
        replacement="and dev.liveness is Liveness.ONLINE",
        caught_by=(
            "tests/unit/engine/test_takeovers.py::test_a_device_a_person_has_takes_no_new_work_until_the_handback",
        ),
    ),
    Mutant(
        id="view-frames-paced-from-sending",
        rule="A live view keeps its rate on a fixed cadence: a slow capture does not push later frames back.",
        file="device_agent/screen/leases.py",
        original="        stream.next_at = planned if planned > now else now + step\n",
        replacement="        stream.next_at = now + step\n",
        caught_by=(
            "tests/unit/device_agent/screen/test_leases.py::test_a_slow_capture_keeps_the_rate_without_a_burst",
        ),
    ),
    Mutant(
        id="agent-input-during-owner-takeover",
        rule="The agent refuses the model's input tools while a person has the screen, the owner included.",
        file="device_agent/takeover.py",
        original="return self.active and not read_only and",
        replacement="return self.operator and not read_only and",
        caught_by=(
            "tests/unit/device_agent/test_takeover.py::"
            "test_while_a_person_has_the_device_the_models_input_tools_are_refused_and_reading_is_not",
        ),
    ),
]

# ------------------------------------------------------------------ rules of designs prototyped in the simulator
# A design's rules live in its prototype (tests/sim) until the product builds it; its mutants are
# caught by the prototype's own simulation, like the product's by theirs.
PROTOTYPES: tuple[str, ...] = ("tests/sim/shards.py",)

MUTANTS.append(
    Mutant(
        id="shard-claim-ignores-fence",
        rule=(
            "A shard takes a device only by a compare-and-set on the claim it read (owner and owner "
            "fence), so a claim read before the dead shard's next leader re-claimed it takes nothing."
        ),
        file="tests/sim/shards.py",
        original="                and row.owner_fence == op.seen_fence\n",
        replacement="",
        caught_by=(
            "tests/sim/test_shards.py::test_a_claim_from_a_stale_view_of_a_device_is_refused",
            "tests/sim/test_shards.py::test_shard_seed_sweep",
        ),
    )
)
