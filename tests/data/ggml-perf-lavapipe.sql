CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-12-04T15:59:29Z', 'd99724f2', 'Vulkan0', 'ADD', 'name=add[size=65537],type=f32,ne=[65537,1,1,1],op_params=[],sources=f32[65537,1,1,1],f32[65537,1,1,1]', 'perf', '1', '1', '', '1462.002197', '0.000000', '0.500979', '768', '8192', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-12-04T15:59:31Z', 'd99724f2', 'Vulkan0', 'MUL_MAT', 'name=quantized_matmul[n_rows=64,n_cols=1024,dtype=Q4_0],type=f32,ne=[64,1,1,1],op_params=[],sources=q4_0[1024,64,1,1],f32[1024,1,1,1]', 'perf', '1', '1', '', '247.237671', '0.000000', '0.155257', '40', '8192', '', '');
