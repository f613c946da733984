-- dart-ray durable log: DDL for MySQL 8 and MariaDB 10.11 (idempotent: safe to load twice).
--
-- The same schema as the SQLAlchemy metadata in dart_ray/store/db.py: tests/store/test_schema.py
-- loads this file into a real server and compares it with the metadata, column by column and
-- index by index. `dart-ray db init` creates the same tables; this file is for administrators
-- who provision the database themselves. Collations: utf8mb4_bin for identifiers (byte-wise,
-- case-sensitive), utf8mb4_unicode_ci for text; both exist on MySQL 8 and MariaDB
-- (utf8mb4_0900_ai_ci is MySQL-only).
--
-- rollout_run.state: 0 available, 1 claimed (leased), 2 consumed (trained), 3 dropped,
-- 4 quarantined (bad data: an unreadable blob, a group whose curation raised).
-- ix_rollout_run_claim serves the claim: WHERE run_id = ? AND state = 0 [AND version_num >= ?]
-- ORDER BY version_num, id LIMIT n FOR UPDATE SKIP LOCKED.

CREATE TABLE IF NOT EXISTS checkpoint (
	id BIGINT NOT NULL AUTO_INCREMENT,
	name VARCHAR(50) NOT NULL,
	version VARCHAR(50) NOT NULL,
	version_num BIGINT NOT NULL,
	run_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	status VARCHAR(20) NOT NULL DEFAULT 'PENDING',
	path VARCHAR(1024),
	source VARCHAR(50) NOT NULL DEFAULT 'train',
	operator VARCHAR(50) NOT NULL DEFAULT '',
	remark VARCHAR(1024) NOT NULL DEFAULT '',
	error TEXT,
	config_yaml TEXT,
	created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	deleted_at DATETIME(6),
	started_at DATETIME(6),
	finished_at DATETIME(6),
	PRIMARY KEY (id),
	CONSTRAINT uq_checkpoint_run_version UNIQUE (run_id, version_num),
	KEY ix_checkpoint_created_at (created_at),
	KEY ix_checkpoint_status (status),
	KEY ix_checkpoint_updated_at (updated_at)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS dataset_usage_events (
	id BIGINT NOT NULL AUTO_INCREMENT,
	run_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	trajectory_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	row_id BIGINT NOT NULL,
	model_version VARCHAR(512) NOT NULL DEFAULT '',
	used_delta INTEGER NOT NULL DEFAULT '0',
	event_type VARCHAR(16) NOT NULL,
	claim_id VARCHAR(64) COLLATE utf8mb4_bin,
	consumer VARCHAR(191) COLLATE utf8mb4_bin,
	reason VARCHAR(64),
	created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (id),
	KEY ix_usage_claim (claim_id),
	KEY ix_usage_run_row (run_id, row_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS episode_start (
	run_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	trajectory_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	task_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	group_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL DEFAULT '',
	group_size INTEGER NOT NULL DEFAULT '0',
	trace_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL DEFAULT '',
	rollouter VARCHAR(191) COLLATE utf8mb4_bin NOT NULL DEFAULT '',
	version_num BIGINT NOT NULL DEFAULT '0',
	started_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (run_id, trajectory_id),
	KEY ix_episode_start_rollouter (run_id, rollouter)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS rollout_run (
	id BIGINT NOT NULL AUTO_INCREMENT,
	run_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	trajectory_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	task_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	trace_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL DEFAULT '',
	group_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL DEFAULT '',
	group_size INTEGER NOT NULL DEFAULT '0',
	uri VARCHAR(1024) NOT NULL,
	reward DOUBLE NOT NULL,
	num_steps INTEGER NOT NULL,
	status VARCHAR(16) NOT NULL,
	state SMALLINT NOT NULL DEFAULT '0',
	used INTEGER NOT NULL DEFAULT '0',
	model_version VARCHAR(512) NOT NULL DEFAULT '',
	version_num BIGINT NOT NULL,
	instruction TEXT NOT NULL,
	claim_id VARCHAR(64) COLLATE utf8mb4_bin,
	claimed_by VARCHAR(191) COLLATE utf8mb4_bin,
	claimed_at DATETIME(6),
	lease_expires_at DATETIME(6),
	drop_reason VARCHAR(64),
	created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (id),
	CONSTRAINT uq_rollout_run_trajectory_run UNIQUE (trajectory_id, run_id),
	KEY ix_rollout_run_claim (run_id, state, version_num, id),
	KEY ix_rollout_run_claim_id (claim_id),
	KEY ix_rollout_run_lease (state, lease_expires_at),
	KEY ix_rollout_run_task (run_id, task_id, id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS run (
	run_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	name VARCHAR(191) NOT NULL,
	status VARCHAR(16) NOT NULL DEFAULT 'RUNNING',
	config_json TEXT NOT NULL,
	started_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	finished_at DATETIME(6),
	PRIMARY KEY (run_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS task_stats (
	run_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	task_id VARCHAR(191) COLLATE utf8mb4_bin NOT NULL,
	attempts INTEGER NOT NULL DEFAULT '0',
	successes INTEGER NOT NULL DEFAULT '0',
	failures_env INTEGER NOT NULL DEFAULT '0',
	success_steps_total BIGINT NOT NULL DEFAULT '0',
	success_steps_max INTEGER NOT NULL DEFAULT '0',
	last_success_uri VARCHAR(1024),
	last_success_trajectory_id VARCHAR(191) COLLATE utf8mb4_bin,
	last_success_version BIGINT,
	updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (run_id, task_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_unicode_ci;

