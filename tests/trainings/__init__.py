"""Trainings that import nothing of this project: they print what their framework prints.

Each is a script run as a pod's command (end-to-end tests) or a child process
(parser tests); ``STEPS``/``EPOCHS``/``SLEEP`` in the environment size them.
"""
