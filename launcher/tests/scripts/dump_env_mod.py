import runpy
runpy.run_path(__file__.replace("dump_env_mod.py", "dump_env.py"))
