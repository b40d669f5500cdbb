"""The local web viewer (Flask). Import :func:`attnscope.serve.app.create_app`; importing
``attnscope`` itself never imports Flask."""
