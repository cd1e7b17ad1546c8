"""Audit events are append-only in the database itself: an UPDATE may only clear the actor or
project reference (their rows were deleted); DELETE is refused. PostgreSQL only."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION portal_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'audit events cannot be deleted';
    END IF;
    IF (NEW.created_at, NEW.actor_label, NEW.action, NEW.target_type, NEW.target_id,
        NEW.data, NEW.remote_addr) IS DISTINCT FROM
       (OLD.created_at, OLD.actor_label, OLD.action, OLD.target_type, OLD.target_id,
        OLD.data, OLD.remote_addr)
       OR (NEW.actor_id IS NOT NULL AND NEW.actor_id IS DISTINCT FROM OLD.actor_id)
       OR (NEW.project_id IS NOT NULL AND NEW.project_id IS DISTINCT FROM OLD.project_id) THEN
        RAISE EXCEPTION 'audit events cannot be changed';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS portal_auditevent_append_only ON portal_auditevent;
CREATE TRIGGER portal_auditevent_append_only BEFORE UPDATE OR DELETE ON portal_auditevent
    FOR EACH ROW EXECUTE FUNCTION portal_auditevent_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS portal_auditevent_append_only ON portal_auditevent;
DROP FUNCTION IF EXISTS portal_auditevent_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("portal", "0001_tenancy")]
    operations = [migrations.RunPython(forwards, backwards)]
