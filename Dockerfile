FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pgqueue ./pgqueue
COPY _pgqueue_launcher.py ./
RUN pip install --no-cache-dir .
RUN useradd --create-home pgqueue
USER pgqueue
ENTRYPOINT []
