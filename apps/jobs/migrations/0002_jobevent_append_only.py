from django.db import migrations

# The event log is the job's history: the database refuses to rewrite it. (TRUNCATE stays
# allowed: it is an administrative reset, and the test runner's flush uses it.)
APPEND_ONLY = """
CREATE OR REPLACE FUNCTION jobs_jobevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'jobs_jobevent is append-only (% refused)', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobs_jobevent_no_update_delete
    BEFORE UPDATE OR DELETE ON jobs_jobevent
    FOR EACH ROW EXECUTE FUNCTION jobs_jobevent_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS jobs_jobevent_no_update_delete ON jobs_jobevent;
DROP FUNCTION IF EXISTS jobs_jobevent_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]

    operations = [migrations.RunSQL(APPEND_ONLY, DROP)]
