"""Process plumbing every part of a run leans on, with no glm_grpo_ds import outside this package: the console
and the run's log files (log, run_log), CUDA usability (cuda_check), peak-memory probes (memory_probe), the
per-rank CPU threads (threads), file modes under the umask (file_modes), the framework versions (versions),
a launch's rendezvous port (ports), its deepspeed command line (local_launch) and its hostfile (hostfile), the
run's seeds (seeding) and the name -> factory registries (registries).
Nothing here knows about GLM-Image or GRPO; import the modules themselves (this file imports nothing)."""
