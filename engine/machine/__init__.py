"""What this machine is: its capability probe (``probe``), compute devices (``devices``) and peak memory readers
(``peak_memory``)."""
