"""Times in the admin to the second, in one unambiguous form (Django's English default
shows "Nov. 25, 2026, 3:31 p.m.", to the minute: too coarse for a platform that
preempts within seconds)."""

DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
TIME_FORMAT = "H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
