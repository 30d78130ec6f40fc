"""Old databases lose the device rows no device made (issue 37, finding 3).

Before issue 37's fix (7857e52), the ingest made a device row for every id an enrollment request
named (anyone with the bootstrap password could make thousands) and for the reserved broker
accounts (``edgesdk-enroll``, ``fleet-operator``) when they published on the devices' topics;
group rollouts then included them. Today neither makes a row, so this removes what they left:

* every row of a reserved account id: its device row, telemetry, events, OTA history and
  enrollment request (the enrollment registry refuses these ids);
* a device row that an enrollment request alone made: its id has an enrollment request, and the
  device never said anything of its own (no presence, telemetry, OTA status, model, key, nor a
  telemetry, event or OTA-history row). A real device that was approved gets its row back from
  its first presence.

Past deployments keep their member lists (history is not rewritten). Data removed cannot be
brought back: the downgrade does nothing.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 19:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: The broker accounts that are not devices (edgesdk.fleet.broker_credentials.RESERVED_USERNAMES
#: when this revision was written; a migration keeps its own copy, the module may change).
RESERVED = ("edgesdk-enroll", "fleet-operator")
_TABLES_BY_DEVICE = ("telemetry", "telemetry_minutely", "events", "ota_history", "enrollment_requests", "devices")


def upgrade() -> None:
    bind = op.get_bind()
    for table in _TABLES_BY_DEVICE:
        bind.execute(
            sa.text(f"DELETE FROM {table} WHERE device_id IN :ids").bindparams(  # noqa: S608 - fixed names
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": list(RESERVED)},
        )
    bind.execute(
        sa.text(
            "DELETE FROM devices WHERE presence_ts IS NULL AND telemetry_seq IS NULL AND ota_state IS NULL"
            " AND model_name IS NULL AND public_key IS NULL"
            " AND device_id IN (SELECT device_id FROM enrollment_requests)"
            " AND device_id NOT IN (SELECT device_id FROM telemetry)"
            " AND device_id NOT IN (SELECT device_id FROM events)"
            " AND device_id NOT IN (SELECT device_id FROM ota_history)"
        )
    )


def downgrade() -> None:
    pass  # removed rows are not restored
